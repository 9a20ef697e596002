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


def dumps(obj):
    """Returns the frames of obj: [pickle bytes, buffer, buffer, ...]."""
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
