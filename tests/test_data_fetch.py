"""`va-bench data fetch coco` against a local HTTP server (127.0.0.1) that honours Range requests:
checksums, resume of a partial download, path escapes, the layout the harness then reads."""

import hashlib
import io
import json
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import COCO_DIR, YOLOX_NANO, requires_coco, requires_yolox, run_in_process

from harness.data.fetch import Archive, FetchError, download_resumable, fetch_archives
from harness.errors import UsageError


class RangeHandler(SimpleHTTPRequestHandler):
    """Python's file server plus single-range requests (what a resumed download sends)."""

    requests_seen: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        RangeHandler.requests_seen.append(self.headers.get("Range") or "")
        if self.path.endswith("/cut.onnx"):  # a connection that drops: 1000 bytes of the 4 MB announced
            self.send_response(200)
            self.send_header("Content-Length", "4000000")
            self.end_headers()
            self.wfile.write(b"\0" * 1000)
            self.close_connection = True
            return
        spec = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not spec or not path.is_file():
            return super().do_GET()
        data = path.read_bytes()
        start = int(spec.removeprefix("bytes=").split("-")[0])
        if start >= len(data):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[start:])


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    RangeHandler.requests_seen = []
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _publish(root: Path, path: str, data: bytes) -> str:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_bytes(data)
    return hashlib.sha1(data).hexdigest()


@requires_coco
def test_fetch_builds_the_layout_the_harness_reads(server, tmp_path):
    """Real sample images and annotations zipped like the COCO site's archives, fetched, then used by a run."""
    root, url = server
    images = sorted((COCO_DIR / "val2017").glob("*.jpg"))[:3]
    annotations = json.loads((COCO_DIR / "annotations" / "instances_val2017_subset.json").read_text())
    keep = {int(p.stem) for p in images}
    annotations["images"] = [i for i in annotations["images"] if i["id"] in keep]
    annotations["annotations"] = [a for a in annotations["annotations"] if a["image_id"] in keep]
    val = _zip({f"val2017/{p.name}": p.read_bytes() for p in images})
    ann = _zip({"annotations/instances_val2017.json": json.dumps(annotations).encode(),
                "annotations/instances_train2017.json": b"{}"})
    archives = (Archive("zips/val2017.zip", _publish(root, "zips/val2017.zip", val), "val2017", files=len(images)),
                Archive("annotations/annotations_trainval2017.zip",
                        _publish(root, "annotations/annotations_trainval2017.zip", ann), "annotations",
                        only=("annotations/instances_val2017.json",)))
    dest = tmp_path / "coco"
    lines = fetch_archives(dest, archives, base_url=url)
    assert len(lines) == 2 and all("verified" in line for line in lines)
    assert sorted(p.name for p in (dest / "val2017").iterdir()) == [p.name for p in images]
    assert [p.name for p in (dest / "annotations").iterdir()] == ["instances_val2017.json"]  # train not extracted
    assert not (dest / ".downloads").exists()
    requests = len(RangeHandler.requests_seen)
    again = fetch_archives(dest, archives, base_url=url)  # everything there: nothing is downloaded twice
    assert all("already present" in line for line in again) and len(RangeHandler.requests_seen) == requests
    (dest / "val2017" / images[0].name).unlink()  # one image short: that archive is fetched again
    assert "verified" in fetch_archives(dest, archives, base_url=url)[0]
    assert sorted(p.name for p in (dest / "val2017").iterdir()) == [p.name for p in images]
    result = run_in_process("run", "--coco-dir", str(dest), "--limit", "3", "--warmup-batches", "1",
                            "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0",
                            "--output-dir", str(tmp_path / "o"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cells"][0]["status"] == "ok"


def test_a_partial_download_resumes_with_a_range_request(server, tmp_path):
    root, url = server
    data = bytes(range(256)) * 4096
    _publish(root, "big.bin", data)
    part = tmp_path / "big.bin.part"
    part.write_bytes(data[:100_000])
    download_resumable(f"{url}/big.bin", part)
    assert part.read_bytes() == data
    assert RangeHandler.requests_seen[-1] == "bytes=100000-"


def test_a_corrupt_download_is_refused_and_deleted(server, tmp_path):
    root, url = server
    _publish(root, "zips/val2017.zip", _zip({"val2017/1.jpg": b"x"}))
    archive = Archive("zips/val2017.zip", "0" * 40, "val2017")
    with pytest.raises(FetchError, match="SHA-1") as refused:
        fetch_archives(tmp_path / "coco", (archive,), base_url=url)
    # a mirror that serves another file fails the same way on every try: the user is sent to the mirror
    assert f"check that {url} serves COCO's own zips/val2017.zip" in str(refused.value)
    assert not (tmp_path / "coco" / "val2017").exists()
    assert not list((tmp_path / "coco").rglob("*.part"))


def test_a_web_page_for_an_archive_is_named_and_a_file_is_no_destination(server, tmp_path):
    """A server answering with a page (a captive portal, a moved mirror) is said so, not called a corrupt download
    to fetch again; --dest naming a file is refused before anything is asked."""
    root, url = server
    _publish(root, "zips/val2017.zip", b"<html><body>sign in</body></html>")
    (root / "zips" / "val2017.html").write_bytes(b"<html>moved</html>")
    archive = Archive("zips/val2017.html", "0" * 40, "val2017")
    with pytest.raises(FetchError, match="answered with a web page"):
        fetch_archives(tmp_path / "coco", (archive,), base_url=url)
    assert not list((tmp_path / "coco").rglob("*.part"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(UsageError, match="is not a folder"):
        fetch_archives(a_file, (archive,), base_url=url)


def test_members_that_escape_the_destination_are_refused(server, tmp_path):
    root, url = server
    sha = _publish(root, "zips/val2017.zip", _zip({"val2017/ok.jpg": b"x", "../../evil.txt": b"x"}))
    with pytest.raises(FetchError, match="outside"):
        fetch_archives(tmp_path / "coco", (Archive("zips/val2017.zip", sha, "val2017"),), base_url=url)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path.parent / "evil.txt").exists()


def test_an_unreachable_server_is_one_line_exit_1(tmp_path):
    result = run_in_process("data", "fetch", "coco", "--dest", str(tmp_path / "c"), "--base-url",
                            "http://127.0.0.1:9")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "could not download" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "c").exists()  # nothing fetched: no empty folders left behind


def test_a_download_the_server_cut_short_is_kept_to_resume(server, tmp_path):
    """A server that closes the connection cleanly after 1000 of the 4 MB it announced: the part stays for the
    next run to continue, and the error says so (it is not verified as a whole file and deleted)."""
    _, url = server
    part = tmp_path / "cut.onnx.part"
    with pytest.raises(FetchError, match="stopped after 1000 of 4000000 bytes; run the same command again"):
        download_resumable(f"{url}/cut.onnx", part)
    assert part.stat().st_size == 1000


@pytest.mark.parametrize("url", ["notaurl", "", "ftp://host/coco", "http://"])
def test_a_base_url_that_is_no_url_is_refused_before_anything_is_made(tmp_path, url):
    result = run_in_process("data", "fetch", "coco", "--dest", str(tmp_path / "c"), "--base-url", url)
    assert result.returncode == 2 and "is not an http(s):// or file:// URL" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "c").exists()


@pytest.mark.parametrize("served, expected", [
    ("cut.onnx", "stopped after 1000 of 4000000 bytes"),
    ("page.html", "answered with a web page"),
    ("junk.onnx", "is not an ONNX model"),
])
def test_models_fetch_keeps_no_download_that_is_not_the_model(server, tmp_path, monkeypatch, served, expected):
    """A cut connection, a web page and bytes that are no ONNX model: one line, exit 1, nothing in the cache (a
    later fetch would have called it "already present", and a run would have failed on it)."""
    import dataclasses

    from harness.models import registry

    root, base = server
    (root / "page.html").write_text("<html>moved</html>")
    (root / "junk.onnx").write_bytes(b"not a model at all")
    entry = registry.REGISTRY["yolox-tiny"]
    monkeypatch.setitem(registry.REGISTRY, "yolox-tiny", dataclasses.replace(entry, weights_url=f"{base}/{served}"))
    cache = tmp_path / "weights"
    result = run_in_process("models", "fetch", "yolox-tiny", "--force", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert result.returncode == 1 and expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not cache.exists() or not any(cache.iterdir()), sorted(cache.iterdir())


@requires_yolox
def test_models_fetch_checks_weights_as_a_run_would(server, tmp_path, monkeypatch):
    """The nano graph served as yolox-tiny's, or found in the cache under its name: refused as another variant's
    weights (a run would refuse them), the download kept nowhere; a cache that cannot be written is named before
    anything is downloaded, exit 2."""
    import dataclasses

    from harness.models import registry, yolox

    root, base = server
    (root / "nano.onnx").write_bytes(YOLOX_NANO.read_bytes())
    entry = registry.REGISTRY["yolox-tiny"]
    monkeypatch.setitem(registry.REGISTRY, "yolox-tiny", dataclasses.replace(entry, weights_url=f"{base}/nano.onnx"))
    monkeypatch.setattr(yolox, "OFFLINE_DIR", tmp_path / "nowhere")
    cache = tmp_path / "weights"
    wrong = run_in_process("models", "fetch", "yolox-tiny", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert wrong.returncode == 1 and "is not yolox-tiny's weights" in wrong.stderr, wrong.stderr
    assert "looks like yolox-nano" in wrong.stderr and not (cache / "yolox_tiny.onnx").exists()
    assert ".part" not in wrong.stderr and "run it as --model" not in wrong.stderr  # a download's refusal, not a run's
    cache.mkdir(exist_ok=True)
    (cache / "yolox_tiny.onnx").write_bytes(YOLOX_NANO.read_bytes())
    present = run_in_process("models", "fetch", "yolox-tiny", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert present.returncode == 2 and "is there but is not its weights" in present.stderr, present.stderr
    assert len(present.stderr.strip().splitlines()) == 1 and "--force downloads them again" in present.stderr
    elsewhere = run_in_process("models", "fetch", "yolox-tiny",  # found first, outside the cache: --force is no fix
                               env={"VA_BENCH_WEIGHTS": str(tmp_path / "empty"),
                                    "VA_BENCH_YOLOX_TINY": str(cache / "yolox_tiny.onnx")})
    assert elsewhere.returncode == 2 and "replace or remove that file" in elsewhere.stderr, elsewhere.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    requests = len(RangeHandler.requests_seen)
    unwritable = run_in_process("models", "fetch", "yolox-tiny", env={"VA_BENCH_WEIGHTS": str(a_file)})
    assert unwritable.returncode == 2 and "the weights cache" in unwritable.stderr, unwritable.stderr
    assert "VA_BENCH_WEIGHTS" in unwritable.stderr and len(RangeHandler.requests_seen) == requests


@requires_yolox
def test_models_fetch_skips_weights_found_locally_and_force_downloads(server, tmp_path, monkeypatch):
    """`models fetch yolox-nano` where the weights are already found: no request; `--force` downloads them
    (here from 127.0.0.1) into the weights cache, the file byte-identical to the served one."""
    import dataclasses

    from harness.models import registry, yolox

    root, base = server
    (root / "yolox_nano.onnx").write_bytes(YOLOX_NANO.read_bytes())
    entry = registry.REGISTRY["yolox-nano"]
    monkeypatch.setitem(registry.REGISTRY, "yolox-nano",
                        dataclasses.replace(entry, weights_url=f"{base}/yolox_nano.onnx"))
    cache = tmp_path / "weights"
    present = run_in_process("models", "fetch", "yolox-nano", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert present.returncode == 0, present.stderr
    assert "already present" in present.stdout and RangeHandler.requests_seen == []
    assert hashlib.sha256(YOLOX_NANO.read_bytes()).hexdigest() in present.stdout.replace("\n", "")
    forced = run_in_process("models", "fetch", "yolox-nano", "--force", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert forced.returncode == 0, forced.stderr
    assert len(RangeHandler.requests_seen) == 1
    assert (cache / "yolox_nano.onnx").read_bytes() == YOLOX_NANO.read_bytes()
    assert not list(cache.glob(".*part"))  # no temp file left
    monkeypatch.setattr(yolox, "OFFLINE_DIR", tmp_path / "nowhere")  # nothing found: a plain fetch downloads
    monkeypatch.delenv("VA_BENCH_YOLOX_NANO", raising=False)
    (cache / "yolox_nano.onnx").unlink()
    fetched = run_in_process("models", "fetch", "yolox-nano", env={"VA_BENCH_WEIGHTS": str(cache)})
    assert fetched.returncode == 0 and len(RangeHandler.requests_seen) == 2
    assert (cache / "yolox_nano.onnx").is_file()


@requires_yolox
def test_models_fetch_refuses_a_release_file_other_than_the_pinned_one_and_takes_a_mirror(server, tmp_path,
                                                                                           monkeypatch):
    """The nano graph with one weight scaled (the right shape and parameter count) was kept as the official weights.
    Its release file's SHA-256 is pinned: anything else is refused, nothing kept. `--base-url` fetches the release
    file by its name from a mirror; a temp file a killed download left is removed."""
    import onnx
    from onnx import numpy_helper

    from harness.models import yolox

    root, base = server
    model = onnx.load(str(YOLOX_NANO))
    first = model.graph.initializer[0]
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 1.5, first.name))
    (root / "mirror").mkdir()
    onnx.save(model, str(root / "mirror" / "yolox_nano.onnx"))
    (root / "good").mkdir()
    (root / "good" / "yolox_nano.onnx").write_bytes(YOLOX_NANO.read_bytes())
    monkeypatch.setattr(yolox, "OFFLINE_DIR", tmp_path / "nowhere")
    monkeypatch.delenv("VA_BENCH_YOLOX_NANO", raising=False)
    cache = tmp_path / "weights"
    cache.mkdir()
    (cache / ".yolox_nano.onnx.abc123.part").write_bytes(b"half a file")
    other = run_in_process("models", "fetch", "yolox-nano", "--base-url", f"{base}/mirror",
                           env={"VA_BENCH_WEIGHTS": str(cache)})
    assert other.returncode == 1 and "is not yolox-nano's release file (SHA-256" in other.stderr, other.stderr
    assert sorted(cache.iterdir()) == []
    good = run_in_process("models", "fetch", "yolox-nano", "--base-url", f"{base}/good/",
                          env={"VA_BENCH_WEIGHTS": str(cache)})
    assert good.returncode == 0 and "checked against the release's" in " ".join(good.stdout.split()), good.stderr
    assert (cache / "yolox_nano.onnx").read_bytes() == YOLOX_NANO.read_bytes()
    library = run_in_process("models", "fetch", "rtdetr-r18", "--base-url", base)
    assert library.returncode == 2 and "--base-url applies to a model whose release file" in library.stderr
    # a mirror that is no http(s):// or file:// URL is refused at once, as `data fetch` refuses it (a bare host was
    # taken for a scheme, and ftp:// tried for a minute)
    for bad in ("127.0.0.1:8701/good", "ftp://127.0.0.1:8701/good"):
        refused = run_in_process("models", "fetch", "yolox-nano", "--force", "--base-url", bad,
                                 env={"VA_BENCH_WEIGHTS": str(cache)})
        assert refused.returncode == 2 and "is not an http(s):// or file:// URL" in refused.stderr, refused.stderr
