"""Dataset variants: fingerprints, completeness checks, the 80 -> 91 class mapping."""

import json
import re

import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, VAL_INDEX, requires_coco

from harness.data.categories import COCO80_TO_91
from harness.data.coco import CocoDataset
from harness.data.variants import FULL_VAL2017_SHA256, MINI500_SHA256, image_id_sha256, mini500_ids
from harness.errors import UsageError


def test_fingerprint_is_order_independent_and_matches_site_scheme():
    assert image_id_sha256([3, 1, 2]) == image_id_sha256([1, 2, 3])
    import hashlib

    assert image_id_sha256([139, 285]) == hashlib.sha256(b"139\n285").hexdigest()


@pytest.mark.skipif(not VAL_INDEX.is_file(), reason=f"official val2017 index not found at {VAL_INDEX}")
def test_stored_fingerprints_equal_the_official_index():
    ids = sorted(img["id"] for img in json.loads(VAL_INDEX.read_text())["images"])
    assert len(ids) == 5000
    assert image_id_sha256(ids) == FULL_VAL2017_SHA256
    assert list(mini500_ids()) == ids[:500]
    assert image_id_sha256(ids[:500]) == MINI500_SHA256


@requires_coco
def test_category_mapping_equals_annotation_categories():
    cats = json.loads(SUBSET_ANNOTATIONS.read_text())["categories"]
    assert sorted(c["id"] for c in cats) == list(COCO80_TO_91)


@requires_coco
def test_sample_variant_is_the_complete_local_set():
    ds = CocoDataset(COCO_DIR)
    v = ds.variant("sample")
    assert v.name == "sample" and v.num_images == 206
    assert all(r.path.is_file() for r in ds.records(v))


@requires_coco
def test_limit_labels_subset_n():
    v = CocoDataset(COCO_DIR).variant("sample", limit=10)
    assert v.name == "subset10" and v.num_images == 10 and v.base == "sample"
    assert list(v.image_ids) == sorted(v.image_ids)


@requires_coco
def test_mini500_on_the_sample_is_refused_with_counts():
    with pytest.raises(UsageError) as err:
        CocoDataset(COCO_DIR).variant("mini500")
    message = str(err.value)
    assert "mini500" in message and "500" in message and "478 are missing" in message
    assert "annotations/ and val2017/" in message and "va-bench data fetch coco" in message


@requires_coco
def test_full_on_the_sample_is_refused():
    with pytest.raises(UsageError, match="5000"):
        CocoDataset(COCO_DIR).variant("full")


@requires_coco
def test_missing_image_file_is_reported(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    (tmp_path / "annotations" / "instances_val2017_subset.json").write_text(SUBSET_ANNOTATIONS.read_text())
    images = sorted(json.loads(SUBSET_ANNOTATIONS.read_text())["images"], key=lambda i: i["id"])
    named = f"206 image files absent: {images[0]['file_name']}, {images[1]['file_name']}, ...)"
    with pytest.raises(UsageError, match=re.escape(named)):
        CocoDataset(tmp_path).variant("sample")


def test_no_coco_anywhere_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no COCO val2017 annotations"):
        CocoDataset(tmp_path)


@requires_coco
def test_variant_checks_only_its_own_image_files(tmp_path):
    """A broken image outside the variant (past --limit) does not stop it; inside, it is a UsageError."""
    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    (tmp_path / "annotations" / "instances_val2017_subset.json").write_text(SUBSET_ANNOTATIONS.read_text())
    for path in (COCO_DIR / "val2017").glob("*.jpg"):
        (tmp_path / "val2017" / path.name).symlink_to(path)
    ds = CocoDataset(tmp_path)
    last = ds.record(max(ds.coco.imgs)).path
    last.unlink()
    last.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    assert ds.variant("sample", limit=10).num_images == 10
    with pytest.raises(UsageError, match=f"{last.name} is truncated"):
        ds.variant("sample")
