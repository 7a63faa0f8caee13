"""Minimal, dependency-free (torch + numpy only) safetensors reader/writer.

File layout (https://github.com/huggingface/safetensors):
  * 8 bytes: little-endian u64 N = length of the JSON header in bytes
  * N bytes: UTF-8 JSON object
        {"__metadata__": {str: str, ...},
         "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
         ...}
    padded on the right with spaces so that N is a multiple of 8
  * the data section: raw little-endian, C-contiguous tensor bytes; data_offsets
    are byte offsets relative to the start of the data section.

Like the reference implementation, tensors are laid out ordered by decreasing
element size, then by name, so every tensor starts at an offset aligned to its
element size (the data section itself starts at a multiple of 8).
"""

import json
import struct

import numpy as np
import torch

_TORCH_TO_ST = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_TO_TORCH = {v: k for k, v in _TORCH_TO_ST.items()}
_ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2,
             "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy()
    else:
        arr = t.numpy()
    if arr.dtype.byteorder == ">":
        arr = arr.byteswap().newbyteorder()
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def save_file(tensors, path, metadata=None):
    """Write a dict {name: torch.Tensor} to `path` in safetensors format."""
    for name in tensors:
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved")
    entries = []
    for name, t in tensors.items():
        if t.dtype not in _TORCH_TO_ST:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        entries.append((name, _TORCH_TO_ST[t.dtype], list(t.shape), _tensor_bytes(t)))
    entries.sort(key=lambda e: (-_ITEMSIZE[e[1]], e[0]))

    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for _, _, _, data in entries:
            f.write(data)


def load_file(path):
    """Read a safetensors file; returns (dict {name: torch.Tensor}, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    metadata = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = _ST_TO_TORCH[info["dtype"]]
        buf = bytearray(raw[base + b: base + e])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out, metadata
