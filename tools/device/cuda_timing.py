"""The CUDA-event timing loop of the device peers (prefill_vs_sdpa.py, e2e_peers.py, sdpa_baseline.py).

Pure Python at import: torch is imported inside the functions, never here, so a script can import this
module, parse its arguments and refuse bad input before torch (and CUDA) is touched, and CI without a
torch GPU can import it.

What it measures, the scheme of the C++ timers it is compared with (bench/cuda/decode_attention.cpp's
median_ms, which also runs one warm-up call itself; Engine::time_graph in src/engine/engine.cpp, whose flush
is at most 512 MB): CUDA events around the call, a memset before each rep, element reps/2 of the sorted times:
  for each of `reps` reps: [flush.fill_(rep & 0xFF)]  event a  fn()  event b  b.synchronize()
  -> milliseconds (float, torch.cuda.Event.elapsed_time) between a and b, the GPU time of the work fn
  enqueues on the current CUDA stream (fn's host time counts only where the GPU waits for it).
The flush write is enqueued on the same stream before event a: it runs before fn's work but outside the
timed interval, and evicts fn's data from L2 (512 MiB against the H200's 50 MB L2); the byte value
changes rep to rep so no write is a no-op.
"""

FLUSH_BYTES = 512 << 20  # 536,870,912 bytes: the L2 flush buffer of every peer (= the C++ benchmarks' 512 MB)


def l2_flush_buffer(device="cuda"):
    """A FLUSH_BYTES (512 MiB) torch.uint8 tensor on `device` (a torch.device or its name) to pass as
    median_ms's `flush`. Its contents are undefined; median_ms overwrites it.
    Errors: ImportError without torch; torch's RuntimeError / torch.OutOfMemoryError without a CUDA device
    or without 512 MiB free."""
    import torch
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)


def median_ms(fn, reps, flush=None):
    """Median GPU time in milliseconds of `reps` timed calls of fn() (module docstring: what is timed).

    fn: a callable taking no arguments; its return value is dropped. It must enqueue its GPU work on the
        current CUDA stream (work on another stream is not inside the events unless fn joins it back).
    reps: an int ≥ 1: the number of timed calls. No warm-up happens here: every call is timed, so a
        caller warms up (compilation, autotuning, allocation, lazy loading) and synchronizes first.
    flush: None (no flush: the calls run back to back with warm L2, as the HF decode/prefill step rows
        time them) or a CUDA tensor, normally l2_flush_buffer(), filled with the byte (rep & 0xFF)
        before each rep, outside the events.
    Returns the element reps // 2 of the sorted times: the median for odd reps, the upper of the two
    middle times for even reps (not their mean).
    Errors: ValueError for reps not an int ≥ 1 (before torch is imported); ImportError without torch;
    whatever fn raises, and torch's RuntimeError for a CUDA error or no CUDA device (raised at record or
    synchronize), propagate unchanged; times of the reps before the error are discarded.
    """
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"median_ms: reps must be an int >= 1, got {reps!r}")
    import torch
    ts = []
    for i in range(reps):
        if flush is not None:
            flush.fill_(i & 0xFF)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]
