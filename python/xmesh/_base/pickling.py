"""Pickling for messages: cloudpickle (classes and functions from __main__ or notebook cells
travel by value), protocol 5 with out-of-band buffers so large numpy arrays and CPU torch
tensors are sent without copies, and received into the message's own memory."""
import io
import pickle
import sys

import cloudpickle


def _tensor_from_numpy(array):
    import torch

    return torch.from_numpy(array)


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        # torch tensors get no out-of-band buffers on their own: go through their numpy view.
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad \
                and obj.layout == torch.strided and obj.dtype != torch.bfloat16:
            return _tensor_from_numpy, (obj.detach().numpy(),)
        return super().reducer_override(obj)


_PLAIN_TYPES = (type(None), bool, int, float, str, bytes)


def _plain(obj, depth=0):
    """Small values of builtin types only: nothing cloudpickle would treat differently and no
    buffers worth sending out of band, so the C pickler alone is exact (and much faster)."""
    t = type(obj)
    if t in _PLAIN_TYPES:
        return t is not bytes or len(obj) < 65536
    if depth > 3:
        return False
    if t is tuple or t is list:
        return len(obj) <= 32 and all(_plain(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 32 and all(type(k) is str and _plain(v, depth + 1) for k, v in obj.items())
    return False


def dumps(obj):
    """Returns the frames of obj: [pickle bytes, buffer, buffer, ...]."""
    if _plain(obj):
        return [pickle.dumps(obj, protocol=5)]
    buffers = []
    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    frames = [f.getbuffer()]
    for b in buffers:
        try:
            frames.append(b.raw())
        except BufferError:  # not contiguous: copy once
            frames.append(bytes(memoryview(b)))
    return frames


def loads(frames):
    if not frames:
        raise ValueError("empty payload")
    return pickle.loads(frames[0], buffers=frames[1:])
