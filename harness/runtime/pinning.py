"""Page-locking host memory for device copies: the part of CUDA's runtime the hand-off buffer uses
(`harness.runtime.transport.Publisher`). Its own module so that the rule it keeps (every registration undone before
its memory goes) is tested on the CPU with a stand-in that enforces CUDA's overlap check.
"""

from __future__ import annotations


class Pins:
    """Page-locks host memory for device copies (the part of CUDA's runtime the publisher uses)."""

    def register(self, address: int, nbytes: int) -> None:
        raise NotImplementedError

    def unregister(self, address: int) -> None:
        raise NotImplementedError


class CudaPins(Pins):
    """`cudaHostRegister` / `cudaHostUnregister`, each checked: a failure is raised here, where it happened,
    instead of surfacing in whichever CUDA call comes next."""

    @staticmethod
    def if_available() -> CudaPins | None:
        import torch

        return CudaPins() if torch.cuda.is_available() else None

    def register(self, address: int, nbytes: int) -> None:
        self._check("cudaHostRegister", self._rt().cudaHostRegister(address, nbytes, 0))

    def unregister(self, address: int) -> None:
        self._check("cudaHostUnregister", self._rt().cudaHostUnregister(address))

    @staticmethod
    def _rt():
        import torch

        return torch.cuda.cudart()

    def _check(self, call: str, rc) -> None:
        code = int(getattr(rc, "value", rc))
        if code:
            raise RuntimeError(f"{call} failed: {self._rt().cudaGetErrorString(rc)} (cudaError {code})")
