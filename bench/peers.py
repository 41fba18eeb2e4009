"""The kernels users would pick instead of ours, called in our layouts: mamba-ssm's Triton SSD (`mamba_chunk_scan_combined`)
and decoding step (`selective_state_update`), its CUDA `selective_scan_fn` where the extension is built, and fla's
`chunk_simple_gla`. bench/gpu.py times them; tests/test_triton.py runs mamba-ssm's under Triton's interpreter on tiny shapes.

mamba-ssm comes as a wheel built without CUDA (bench/gpu.sh --wheels: MAMBA_SKIP_CUDA_BUILD=TRUE), so its package
`__init__`, which imports the CUDA extension `selective_scan_cuda`, fails; `mamba_ssm()` then makes the package importable
without running it, and its Triton modules import as usual."""
import contextlib, importlib, importlib.util, sys, types
import torch


def mamba_ssm():
    "Import mamba-ssm's package (with its CUDA extension if built, else without its `__init__`); ImportError naming the wheel if absent."
    if "mamba_ssm" in sys.modules: return sys.modules["mamba_ssm"]
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None: raise ImportError("mamba-ssm is not installed (bench/gpu.sh --wheels builds its wheel without CUDA)")
    try: return importlib.import_module("mamba_ssm")
    except ImportError:  # no selective_scan_cuda: the Triton kernels need none of it
        for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]: del sys.modules[name]
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__, pkg.__file__ = list(spec.submodule_search_locations), spec.origin
        sys.modules["mamba_ssm"] = pkg
        return pkg


def has_selective_scan_cuda():
    "Whether mamba-ssm's CUDA extension (selective_scan_fn's kernel) is importable."
    return importlib.util.find_spec("selective_scan_cuda") is not None


def pin_autotune(prefix):
    """Keep only the first config of every `triton.autotune` in the loaded modules named `prefix...` (through
    `triton.heuristics` wrappers); returns how many were pinned. The interpreter cannot benchmark configs (no driver)."""
    import triton
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == prefix or name.startswith(prefix + ".")): continue
        for v in list(vars(mod).values()):
            while isinstance(v, triton.runtime.KernelInterface):
                if isinstance(v, triton.runtime.Autotuner) and len(v.configs) > 1: v.configs, n = v.configs[:1], n + 1
                v = getattr(v, "fn", None)
    return n


_cuda_device, _cuda_properties = torch.cuda.device, torch.cuda.get_device_properties

def _device_or_none(index):
    "torch.cuda.device, but nothing for a CPU tensor's device index None (which a CPU build of PyTorch refuses)."
    return contextlib.nullcontext() if index is None else _cuda_device(index)


def _properties_or_cpu(device=None):
    "torch.cuda.get_device_properties, but for a CPU device the one property mamba-ssm's backward reads (its SM count, for a grid)."
    if isinstance(device, torch.device) and device.type == "cpu": return types.SimpleNamespace(multi_processor_count=4)
    return _cuda_properties(device)


def _device(x):
    """mamba-ssm wraps its launches, forward and backward, in `torch.cuda.device(x.device.index)` and sizes two backward
    grids by `torch.cuda.get_device_properties(x.device)`; for a CPU tensor (the interpreter) both fail in a CPU build of
    PyTorch, so on the CPU they are made to accept a CPU device (no device; 4 SMs), from then on."""
    if not x.is_cuda: torch.cuda.device, torch.cuda.get_device_properties = _device_or_none, _properties_or_cpu
    return contextlib.nullcontext()


def mamba_ssd(x, dt, A, B, C, chunk_size=256):
    "mamba-ssm's `mamba_chunk_scan_combined` on ssd's arguments: x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n); y (b, l, h, p)."
    mamba_ssm()
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    with _device(x): return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size)


def mamba_step(state, x, dt, A, B, C, D):
    """mamba-ssm's `selective_state_update`: one decoding step, state (b, d, n) updated in place to
    exp(dt A) state + dt x B, returns y = C . state + D x (b, d). Its launcher needs D and dt_bias (zero here) given."""
    mamba_ssm()
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    with _device(x): return selective_state_update(state, x, dt, A, B, C, D=D, dt_bias=torch.zeros_like(D))


def mamba_selective_scan(u, delta, A, B, C, D):
    "mamba-ssm's CUDA `selective_scan_fn` in our layout: u, delta (b, d, l), A (d, n), B, C (b, n, l), softplus on delta; y (b, d, l)."
    mamba_ssm()
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    return selective_scan_fn(u, delta, A, B, C, D, delta_softplus=True)


def fla_simple_gla(x, dt, A, B, C):
    """fla's `chunk_simple_gla` as SSD: q = C, k = B, v = dt x, g = dt A (the log decay per head and step), scale 1, in
    its (b, l, h, .) layout; y (b, l, h, p). Inputs built here, so a timing of it includes the four elementwise ops."""
    from fla.ops.simple_gla import chunk_simple_gla
    b, l, h, _ = x.shape
    q, k = C.expand(b, l, h, C.shape[-1]).contiguous(), B.expand(b, l, h, B.shape[-1]).contiguous()
    return chunk_simple_gla(q, k, (x * dt[..., None]).contiguous(), (dt * A).contiguous(), scale=1.0)[0]
