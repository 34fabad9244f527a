"""The device-resident path on CUDA: decode, upload and the forward's GPU time.

On a GPU the harness must measure the model, not itself: JPEGs decode with nvJPEG in one
batched call (`torchvision.io.decode_jpeg(list, device="cuda")`), or, where images were decoded on the
host, go up as uint8 (4x fewer bytes than float32) from pinned memory with non-blocking copies (with cv2/PIL
letterboxing on the host, the whole uint8 canvas in one copy); the letterbox, normalisation, NMS and rescale
then run on the device (preprocess.preprocess_tensors,
postprocess), the letterbox and the NMS for the whole batch at once (a fixed number of tensor operations, not a
handful per image: each is a Python call under the interpreter lock that the forward's launches need too), and only
the final detections come back, in one copy per batch. CUDA events around the
forward give its GPU time beside the wall clock, so a launch-bound forward shows as wall >> GPU.

Every function here takes the device as an argument and touches torch.cuda only when it is a CUDA
device, so the CPU path and the tests (with fakes) never need a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.detector.protocol import PreprocessSpec
from harness.pipeline.preprocess import decode_tensor

JPEG_MAGIC = b"\xff\xd8"

# What each decoder is, for the record (runtime.preprocess.decode).
DECODERS = {"nvjpeg": "nvJPEG: torchvision.io.decode_jpeg(list, device='cuda'), one batched call",
            "cv2": "cv2.imdecode on the host (libjpeg-turbo), BGR"}


def choose_decoder(library: str, cuda: bool) -> str:
    """The decoder for a preprocessing implementation on a device: cv2/PIL resize cv2-decoded arrays;
    torch decodes with nvJPEG on CUDA (measured on an H100: 10,936 img/s against 3,388 with 16 cv2
    threads) and with cv2 on the host otherwise, as every implementation does there (preprocess.decode_tensor)."""
    return "nvjpeg" if library == "torch" and cuda else "cv2"


def decode_on_device(datas: Sequence[bytes | bytearray], device: torch.device, names: Sequence,
                     oriented: Sequence[bool] | None = None) -> list[torch.Tensor]:
    """JPEG bytes -> 3xHxW uint8 RGB tensors on `device`, in one batched nvJPEG call. nvJPEG decodes JPEG
    only, and ignores EXIF orientation: any other format (none in COCO) and the JPEGs `oriented` marks (an EXIF
    orientation other than 1, found when the dataset's images were checked) are decoded on the host as the torch
    implementation does it there (decode_tensor) and uploaded, image by image."""
    oriented = oriented or [False] * len(datas)
    jpeg = [i for i, d in enumerate(datas) if bytes(d[:2]) == JPEG_MAGIC and not oriented[i]]
    out: list[torch.Tensor | None] = [None] * len(datas)
    if jpeg:
        # a cached image's bytearray as it is (a writable buffer: no copy under the interpreter lock); bytes read
        # from disk are copied into one
        encoded = [torch.frombuffer(d if isinstance(d, bytearray) else bytearray(d), dtype=torch.uint8)
                   for d in (datas[i] for i in jpeg)]
        from torchvision.io import ImageReadMode, decode_jpeg  # nvJPEG: torchvision only where it decodes

        for i, image in zip(jpeg, decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device), strict=True):
            out[i] = image
    for i, d in enumerate(datas):
        if out[i] is None:
            out[i] = upload_uint8([decode_tensor(d, names[i])], device)[0]
    return out


def upload_uint8(images: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host uint8 images -> `device`: pinned staging + non-blocking copies (the copy engine overlaps the
    host's next image); on a CPU device they are returned as they are."""
    if device.type != "cuda":
        return list(images)
    return [image.pin_memory().to(device, non_blocking=True) for image in images]


@dataclass
class ForwardEvents:
    """CUDA events around one forward; `elapsed_ns` waits for the end event only (not the whole device)."""

    start: Any
    end: Any

    @classmethod
    def begin(cls, device: torch.device) -> ForwardEvents:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream(device))
        return cls(start, end)

    def stop(self, device: torch.device) -> None:
        self.end.record(torch.cuda.current_stream(device))

    def elapsed_ns(self) -> int:
        self.end.synchronize()
        return int(round(self.start.elapsed_time(self.end) * 1e6))


def preprocess_record(spec: PreprocessSpec, decoder: str, input_device: torch.device | None,
                      whole_batch: bool = False) -> dict:
    """How this pipeline turns files into the input tensor (runtime.preprocess and the run summary); `whole_batch`:
    the torch letterbox resizes the whole batch at once (preprocess.letterbox_whole_batch)."""
    library = spec.library
    on = input_device if input_device is not None else torch.device("cpu")
    torch_resize = (f"bilinear in float32, the whole batch at once by index (F.interpolate's rule, antialias off), on "
                    f"{on}, its temporaries within 1 % of the device's memory" if whole_batch
                    else f"F.interpolate in float32, antialias off, one image at a time, on {on}")
    resize = {"cv2": "cv2.resize on uint8 (host)", "pil": "PIL resample on uint8 (host)",
              "torch": torch_resize}[library]
    record = {"implementation": library, "decode": decoder, "decode_detail": DECODERS[decoder], "resize": resize,
              "device": str(on)}
    if library == "torch" and on.type == "cuda" and decoder != "nvjpeg":
        record["upload"] = "uint8 from pinned memory, non_blocking"
    elif library != "torch" and on.type == "cuda":
        record["upload"] = "the uint8 canvas from pinned memory, non_blocking; float and normalised on the device"
    return record
