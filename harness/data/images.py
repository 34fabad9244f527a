"""Image files of a dataset variant: a cheap up-front check (before a run folder exists) and a strict
decode that finds corrupt-but-decodable JPEGs (libjpeg warns, OpenCV decodes them anyway).

The formats read are those every decode path of the harness reads with the same pixels: JPEG, PNG, WebP, BMP and
TIFF (cv2 decodes all five on the host, for every implementation: pipeline/preprocess.py decode_tensor; nvJPEG on
CUDA the JPEGs without an orientation). Ultralytics' other suffixes (DNG, PFM, HEIC) have no such decoder and are
refused by their first bytes."""

from __future__ import annotations

import os
import threading
import warnings
import zlib
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import simplejpeg
from PIL import Image

from harness.errors import UsageError

JPEG_SOI = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_IEND = b"IEND\xaeB`\x82"
TIFF_HEADERS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, either byte order
TIFF_STRIPS, TIFF_TILES = (273, 279), (324, 325)  # (offsets, byte counts) of the strips, of the tiles
TIFF_WIDTH, TIFF_HEIGHT, NEW_SUBFILE_TYPE, PHOTOMETRIC = 256, 257, 254, 262
BITS_PER_SAMPLE, COMPRESSION, SAMPLE_FORMAT, CMYK = 258, 259, 339, 5
RAW_PHOTOMETRIC = (32803, 34892)  # colour filter array, linear raw: sensor data, not an RGB picture
# the compressions OpenCV's libtiff decodes: none, CCITT (2-4), LZW, JPEG (old and new), Deflate (both), PackBits;
# ZSTD, LZMA, WebP, LERC and JPEG 2000 are not built in
CV2_TIFF_COMPRESSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 32773, 32946})
BMP_HEADER_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)  # BITMAPCOREHEADER, OS/2 and BITMAPINFOHEADER to V5
HEAD_BYTES = 18
TAIL_PNG_BYTES = 65536  # where a PNG's chunks after its pixel data (an eXIf) are looked for
# Encoders may pad after the end marker; a marker within this many trailing bytes counts as present.
# In JPEG entropy-coded data 0xFF is always stuffed (FF 00), so FF D9 there can only be the EOI marker.
TAIL_BYTES = 1024
FORMATS = "JPEG, PNG, WebP, BMP or TIFF"
HOW_TO_FIX = f"replace it with a whole {FORMATS} file (a COCO image: fetch it again, `va-bench data fetch coco`)"


def image_format(head: bytes) -> str | None:
    """The format of an image file from its first HEAD_BYTES bytes, as the harness reads it ("JPEG", "PNG", "WebP",
    "BMP", "TIFF"); None for any other (a BMP's two-letter signature is confirmed by its header's size)."""
    if head.startswith(JPEG_SOI):
        return "JPEG"
    if head.startswith(PNG_SIGNATURE):
        return "PNG"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WebP"
    if head.startswith(b"BM") and int.from_bytes(head[14:18], "little") in BMP_HEADER_SIZES:
        return "BMP"
    return "TIFF" if head[:4] in TIFF_HEADERS else None


def image_formats(paths: Iterable[Path]) -> dict[str, int]:
    """How many of the (whole, already checked) image files are of each format, most first."""
    counts: dict[str, int] = {}
    for path in paths:
        with open(path, "rb") as fh:
            kind = image_format(fh.read(HEAD_BYTES)) or "other"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def image_file_problem(path: Path) -> str | None:
    """What is wrong with an image file, judged from its size, first and last bytes; None when it looks whole.

    Cheap (two small reads; a TIFF's directory through Pillow's header read): catches empty, truncated and
    non-image files before any decoding. COCO images are JPEGs; PNG, WebP, BMP and TIFF are accepted too.
    Corrupt data in the middle of a whole file needs a decode: see `find_corrupt_images`."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "is empty (0 bytes)"
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read()
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    kind = image_format(head)
    if kind == "JPEG":
        return None if JPEG_EOI in tail else "is truncated (no JPEG end-of-image marker)"
    if kind == "PNG":
        return None if PNG_IEND in tail else "is truncated (no PNG IEND chunk)"
    if kind == "WebP":
        # the RIFF header holds the size of what follows it: a file cut short is smaller
        declared = int.from_bytes(head[4:8], "little") + 8
        return None if size >= declared else f"is truncated ({size} of the {declared} bytes its WebP header gives)"
    if kind == "BMP":
        declared, pixels = int.from_bytes(head[2:6], "little"), int.from_bytes(head[10:14], "little")
        if size < declared or pixels >= size:  # some writers leave the file size 0: the pixels' offset still tells
            return f"is truncated ({size} bytes; its BMP header gives {max(declared, pixels + 1)} or more)"
        return None
    if kind == "TIFF":
        return _tiff_problem(path, size)
    return f"is not a {FORMATS} image (starts with {head[:4].hex(' ')})"


def _tiff_problem(path: Path, size: int) -> str | None:
    """A TIFF has no end marker: its first directory (read by Pillow, pixels untouched) says where each strip or
    tile lies, and a file cut short ends before the last of them (or before the directory itself). The directory
    also says what cv2 cannot decode as a picture (its samples, compression, a preview first), refused here rather
    than in a run's first batch."""
    raw = "is a camera raw (DNG) or a TIFF whose first image is a preview, not the picture; convert it"
    if path.suffix.lower() == ".dng":  # a camera raw's first image is its preview: cv2 would decode that
        return raw
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Pillow only warns of a directory cut short ("Truncated File Read")
            image = _open_header(path)
        with image:
            tags = dict(image.tag_v2)
    except (OSError, SyntaxError, ValueError, Warning) as exc:
        return f"is not a whole TIFF image ({str(exc)[:60]})"
    if tags.get(NEW_SUBFILE_TYPE, 0) & 1 or tags.get(PHOTOMETRIC) in RAW_PHOTOMETRIC:
        return raw
    if problem := _tiff_undecodable(tags):
        return problem
    ends = [offset + count for offsets, counts in (TIFF_STRIPS, TIFF_TILES) if offsets in tags and counts in tags
            for offset, count in zip(_values(tags[offsets]), _values(tags[counts]), strict=False)]
    if not ends:
        return "is not a TIFF image the harness reads (its first directory has no strips or tiles)"
    return None if max(ends) <= size else f"is truncated ({size} of the {max(ends)} bytes its TIFF directory gives)"


def _values(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _tiff_undecodable(tags: dict) -> str | None:
    """Why cv2 (OpenCV's libtiff) cannot decode this TIFF as the picture it is, from its first directory; None when
    it can. Checked on files cv2 decodes or refuses (tests)."""
    bits = max(_values(tags.get(BITS_PER_SAMPLE, 1)))
    sample_format = set(_values(tags.get(SAMPLE_FORMAT, 1)))
    compression = tags.get(COMPRESSION, 1)
    orientation = tags.get(EXIF_ORIENTATION, 1)
    if sample_format - {1} or bits > 16:
        kind = "floating-point" if 3 in sample_format else "signed" if 2 in sample_format else f"{bits}-bit"
        return f"holds {kind} samples (a depth or thermal frame?), not a picture cv2 decodes; convert it to 8-bit"
    if tags.get(PHOTOMETRIC) == CMYK and bits > 8:
        return "is a 16-bit CMYK TIFF, which cv2 does not decode; convert it to 8-bit RGB"
    if compression not in CV2_TIFF_COMPRESSIONS:
        return (f"uses TIFF compression {compression}, which OpenCV's libtiff does not decode; save it with LZW or "
                "Deflate")
    if TIFF_TILES[0] in tags and orientation != 1:
        # OpenCV 5.0 mirrors a tiled TIFF's tile columns under orientations 2, 3, 6 and 7: a scrambled picture
        return (f"is a tiled TIFF with EXIF orientation {orientation}, which OpenCV decodes scrambled; save it in "
                "strips, or upright")
    return None


def check_image_files(paths: Iterable[Path]) -> None:
    """Raise one UsageError line naming the broken image files (the first with its problem, then a count)."""
    broken = [(p, problem) for p in paths if (problem := image_file_problem(p)) is not None]
    if not broken:
        return
    first, problem = broken[0]
    more = ""
    if len(broken) > 1:
        names = ", ".join(p.name for p, _ in broken[1:4])
        more = f" (and {len(broken) - 1} more broken: {names}{', ...' if len(broken) > 4 else ''})"
    raise UsageError(f"image {first} {problem}{more}; {HOW_TO_FIX}")


# EXIF orientations that turn the stored image a quarter turn (width and height swap once it is applied)
QUARTER_TURNS = (5, 6, 7, 8)
EXIF_ORIENTATION = 0x0112


def orientation_warning(orientations: dict[int, int], sizes_annotated: bool = True) -> str | None:
    """A warning for images whose EXIF orientation turns them half a turn or mirrors them (2, 3, 4): decoded as cv2
    shows them, like the quarter turns, but their size cannot confirm that their annotations are of that view.
    Without annotated sizes (a YOLO dataset's labels are fractions of the image read), no turn is confirmed."""
    unconfirmed = sorted((i, o) for i, o in orientations.items() if o not in QUARTER_TURNS or not sizes_annotated)
    if not unconfirmed:
        return None
    first, tag = unconfirmed[0]
    turns = "turns or mirrors them" if not sizes_annotated else "turns them half a turn or mirrors them"
    return (f"warning: {len(unconfirmed)} image(s) carry an EXIF orientation that {turns} "
            f"(image {first}: orientation {tag}); they are decoded upright, as cv2 shows them, and their size "
            "cannot tell whether the annotations are of that view: if they were drawn on the stored pixels, set the "
            "tag to 1 (exiftool -Orientation=1 -n FILE)")


def decoded_size(path: Path) -> tuple[int, int, int]:
    """(width, height, EXIF orientation) of an image as the decoders give it, from its header: the EXIF orientation
    of a JPEG (a phone's multi-picture MPO too), a PNG, a WebP or a TIFF is applied by cv2's imread/imdecode (and by
    the harness's other decoders), so a quarter turn swaps the stored width and height. Reads the header only
    (Pillow opens lazily; ~0.1 ms a COCO image); an image of any pixel count is read (Pillow's bomb limit guards
    decoding, and nothing is decoded here)."""
    with _open_header(path) as image:
        width, height = image.size
        if image.format == "TIFF":  # Pillow reports a TIFF's size already turned by its orientation: the stored one
            width, height = image.tag_v2.get(TIFF_WIDTH, width), image.tag_v2.get(TIFF_HEIGHT, height)
        orientation = _exif_orientation(image)
    return (height, width, orientation) if orientation in QUARTER_TURNS else (width, height, orientation)


def _open_header(path: Path) -> Image.Image:
    """Pillow's lazy open (the header only) of an image of any pixel count: its bomb limit guards decoding, and
    nothing is decoded here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            return Image.open(path)
        except Image.DecompressionBombError:  # above 2x Pillow's limit: read the header without it (rare)
            limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                return Image.open(path)
            finally:
                Image.MAX_IMAGE_PIXELS = limit


def _exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag as cv2 applies it (1 when absent, not a valid tag, or one cv2 does not read). From the
    EXIF block alone: Pillow's `getexif()` falls back to an XMP orientation, which cv2 ignores (and on a PNG decodes
    the whole image to look for EXIF, ~5 ms). A PNG's eXIf chunk may follow its pixels (libpng, and so cv2, reads it
    there too). A TIFF's is its first directory's tag; a WebP's EXIF chunk counts when
    it starts with the TIFF header (cv2 ignores one behind an "Exif\0\0" prefix) and the WebP is not animated (cv2
    turns no animation); a BMP has none."""
    block = image.info.get("exif")
    if image.format == "PNG" and not block:
        block = _png_exif_after_pixels(image.fp)
    if image.format == "TIFF":
        tag = image.tag_v2.get(EXIF_ORIENTATION, 1)
    elif image.format in ("JPEG", "MPO", "PNG", "WEBP") and block:
        if image.format == "WEBP" and (block.startswith(b"Exif\x00\x00") or getattr(image, "is_animated", False)):
            return 1
        exif = Image.Exif()
        exif.load(block)
        tag = exif.get(EXIF_ORIENTATION, 1)
    else:
        tag = 1
    return tag if isinstance(tag, int) and 1 <= tag <= 8 else 1


def _png_exif_after_pixels(fh) -> bytes | None:
    """The eXIf chunk's data of a PNG that holds it after its pixel data, where Pillow does not look before decoding:
    found in the file's last TAIL_PNG_BYTES by its type, its length and its CRC (compressed pixels may hold the four
    letters, never with a matching CRC)."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - TAIL_PNG_BYTES))
    tail = fh.read()
    at = tail.rfind(b"eXIf")
    while at >= 4:
        length = int.from_bytes(tail[at - 4:at], "big")
        end = at + 4 + length
        if end + 4 <= len(tail) and zlib.crc32(tail[at:end]) == int.from_bytes(tail[end:end + 4], "big"):
            return tail[at + 4:end]
        at = tail.rfind(b"eXIf", 0, at)
    return None


def unreadable_reason(exc: Exception, path: Path) -> str:
    """Pillow's reason an image cannot be opened, without the path it repeats ("cannot identify image file
    '/the/path'"): the message names the file already, and a long path cut short hid the reason's end."""
    text = str(exc).replace(repr(str(path)), "").replace(str(path), "").strip(" :'")
    return text[:80] or type(exc).__name__


def check_image_sizes(images: Iterable[tuple[int, Path, int, int]]) -> dict[int, int]:
    """Each (image id, path, width, height) as its annotations give it against the image's own size; one
    UsageError line naming the images that differ (boxes and masks would be scored at the wrong size, silently).
    Returns the EXIF orientation of the images that have one other than 1 (image id -> tag)."""
    wrong, oriented = [], {}
    for image_id, path, width, height in images:
        try:
            actual_w, actual_h, orientation = decoded_size(path)
        except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors for a header it cannot read
            raise UsageError(f"image {path} cannot be read as an image ({unreadable_reason(exc, path)}); "
                             f"{HOW_TO_FIX}") from exc
        if orientation != 1:
            oriented[image_id] = orientation
        if (actual_w, actual_h) != (width, height):
            wrong.append((path, width, height, actual_w, actual_h, orientation))
    if wrong:
        path, width, height, actual_w, actual_h, orientation = wrong[0]
        turned = f" once its EXIF orientation {orientation} is applied" if orientation != 1 else ""
        more = f" (and {len(wrong) - 1} more images)" if len(wrong) > 1 else ""
        if orientation in QUARTER_TURNS and (actual_h, actual_w) == (width, height):
            # a labelling tool that ignores EXIF: width, height and boxes are the stored pixels', not the upright
            # image's; swapping width and height would pass this check with every box still in the wrong frame
            fix = ("the annotations were made on the stored pixels, not the upright image: remove the images' EXIF "
                   "orientation (e.g. exiftran -i) or re-export the dataset with auto-orient")
        else:
            fix = "use the images the annotation file was made for, or fix its width and height"
        raise UsageError(f"image {path} is {actual_w}x{actual_h}{turned} but its annotations say {width}x{height}"
                         f"{more}: boxes and masks would be scored at the wrong size; {fix}")
    return oriented


@dataclass(frozen=True)
class CorruptImage:
    """An image that decodes only with decoder warnings (its pixels are partly garbage)."""

    image_id: int
    path: str
    problem: str  # the decoder's own message, e.g. "Corrupt JPEG data: premature end of data segment"

    def to_dict(self) -> dict:
        return {"image_id": self.image_id, "path": self.path, "problem": self.problem}


def jpeg_decode_problem(data: bytes) -> str | None:
    """libjpeg-turbo's first warning or error when decoding `data` strictly; None when it decodes cleanly.

    OpenCV's decoder prints libjpeg warnings ("Corrupt JPEG data: ...") on stderr and returns an image
    anyway, with no API to see them; simplejpeg's strict mode (TJFLAG_STOPONWARNING) raises them. The
    decode runs at 1/8 scale (DCT scaling): the entropy decoder, where corruption shows, still reads
    the whole stream, at about 60 % of a full decode's cost."""
    try:
        simplejpeg.decode_jpeg(data, strict=True, min_height=1, min_width=1)
    except ValueError as exc:
        return str(exc)
    return None


def find_corrupt_images(records: Iterable, threads: int | None = None) -> list[CorruptImage]:
    """The JPEGs among `records` (anything with `.image_id` and `.path`, e.g. ImageRecord) that decode only
    with warnings or not at all, in order. A full strict decode of each file: ~3 ms per COCO image on
    one core, so a separate pass for a run to record, not an up-front check. Non-JPEG files are skipped.
    The decodes run on `threads` threads, by default one per core (simplejpeg releases the GIL: 0.30 -> 0.16 s
    for the sample on 2)."""
    def problem_of(record) -> CorruptImage | None:
        data = Path(record.path).read_bytes()
        problem = jpeg_decode_problem(data) if data.startswith(JPEG_SOI) else None
        return None if problem is None else CorruptImage(record.image_id, str(record.path), problem)

    workers = threads or max(1, min(8, os.cpu_count() or 1))
    if workers == 1:  # on the calling thread: a daemon's at plan time must leave no pool thread for the exit to wait on
        return [c for c in map(problem_of, records) if c is not None]
    with ThreadPoolExecutor(workers) as pool:
        return [c for c in pool.map(problem_of, records) if c is not None]


def find_corrupt_images_in_background(records: list) -> Future:
    """`find_corrupt_images` on one daemon thread, its result (or exception) in the returned Future. A run starts
    it before it imports torch and the models' libraries: that import holds the interpreter lock on one core for
    1-2 s, while the decodes, which release it, take the other (0.15-0.4 s off the run's start on 2 cores).
    A daemon: a run refused meanwhile does not wait for it."""
    result: Future = Future()

    def check() -> None:
        try:
            result.set_result(find_corrupt_images(records, threads=1))
        except BaseException as exc:  # handed to whoever waits for the result
            result.set_exception(exc)

    threading.Thread(target=check, name="va-jpeg-check", daemon=True).start()
    return result
