"""The files vLLM's connector writes: one safetensors file per request, and the lock-file protocol of its
asynchronous writer (vLLM >= 0.22)."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class NativeExport:
    """One request's export, read back: per requested layer one [tokens, hidden] tensor, in the order asked."""

    hidden_states: list
    token_ids: list[int]
    path: str
    kv_transfer_params: dict
    layout: dict  # tensor name -> (shape, dtype) as stored in the file
    waited_on_lock: bool  # the file came with `<file>.lock` (async writer, vLLM >= 0.22)


@contextmanager
def writer_released(path: str):
    """Hold `path` as the async writer's lock-file protocol says, yielding whether there was a lock to wait on.

    From vLLM 0.22 the connector writes files in a background thread: before the request's path is returned it
    creates `<file>.lock` and holds an exclusive flock on it until the write is done. A reader takes a shared
    flock (sleeping until the writer lets go), reads, then deletes the lock file. Earlier versions write the file
    synchronously in the forward pass and create no lock. The lock is opened read-write: flock on network file
    systems needs a writable descriptor. FileNotFoundError where the file is not there to read (the writer let go
    without writing, or there was nothing to wait on)."""
    lock = path + ".lock"
    if not os.path.exists(lock):
        if not os.path.exists(path):
            raise FileNotFoundError(f"the native export {path} does not exist (and no {lock} to wait on)")
        yield False
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not os.path.exists(path):  # the writer let go without writing: its thread or process died
            raise FileNotFoundError(f"{lock} was released but {path} was never written (the writer failed)")
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    os.remove(lock)


def read_export(path: str, *, remove: bool = True) -> tuple[dict, bool]:
    """The tensors of one native export file, read once its writer let go (`writer_released`), and whether it
    came behind a lock."""
    from safetensors.torch import load_file

    with writer_released(path) as waited:
        data = load_file(path, device="cpu")
    if remove:
        os.remove(path)
    return data, waited


def layout_of(data: dict) -> dict:
    """Tensor name -> (shape, dtype name) of a loaded export file."""
    return {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in data.items()}


def layers_asked(data: dict, path: str, engine_ids: list[int], asked_ids: list[int], tokens: int | None = None) -> list:
    """One [tokens, hidden] tensor per asked native id, in the order asked, from the file's `hidden_states`
    [tokens, distinct ids in stack order, hidden] (vLLM captures each distinct layer once); ValueError naming the
    file where its shape is not that (or, given `tokens`, its row count is not the prompt's)."""
    hs = data.get("hidden_states")
    if hs is None or hs.dim() != 3 or hs.shape[1] != len(engine_ids) or (tokens is not None and hs.shape[0] != tokens):
        layout = layout_of(data)
        raise ValueError(
            f"{path}: expected hidden_states [{'tokens' if tokens is None else tokens}, {len(engine_ids)}, "
            f"hidden], the file holds {layout}"
        )
    return [hs[:, engine_ids.index(j), :] for j in asked_ids]
