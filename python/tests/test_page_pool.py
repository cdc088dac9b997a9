"""ratekv._core.PagePool: the GPU engine's page pool (include/ratekv/engine/page_pool.h) as the CUDA
cache of ratekv.ops uses it — host bookkeeping, so it runs on the CPU. Expected ids are worked out
from the header's rule (lowest free page first; freed pages come back in their order)."""

import numpy as np
import pytest
import torch

import ratekv
from ratekv import _core


def test_cuda_store_layout_sequence_b_holds_pages_b_times_p_onwards():
    """What ops._CudaStore builds: B sequences of max_tokens in a pool of B·P pages; row b of the
    page table is b·P … b·P + P − 1 (the layout of the fixed table the store used before)."""
    B, max_tokens = 3, 130  # P = 3 pages per sequence
    P = -(-max_tokens // 64)
    pool = _core.PagePool([51200, 25600], "K3V3", pages=B * P, max_seq_pages=P, owner="CUDA packed cache")
    seqs = [pool.add_sequence(max_tokens) for _ in range(B)]
    rows = np.full((B, P), -1, dtype=np.int32)
    pool.page_table(seqs, rows)
    assert rows.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert pool.free_pages == 0 and pool.n_sequences == 3
    # The memory is the caller's: torch tensors of layer_bytes, bound by address.
    mem = [torch.zeros(pool.layer_bytes(l), dtype=torch.uint8) for l in range(pool.n_layers)]
    assert [m.numel() for m in mem] == [9 * 51200, 9 * 25600]
    assert not pool.bound
    for l, m in enumerate(mem):
        pool.bind_layer(l, m.data_ptr(), m.numel())
    assert pool.bound
    assert pool.layer_base(1) == mem[1].data_ptr()
    assert pool.page_offset(1, 8) == 8 * 25600
    with pytest.raises(ratekv.RatekvError, match="CUDA packed cache: a request of 1 tokens needs 1 pages"):
        pool.add_sequence(1)


def test_exhaustion_reuse_and_unequal_lengths():
    pool = _core.PagePool([4096], "fp16", pages=8, max_seq_pages=4)
    a = pool.add_sequence(97)   # 2 pages: 0, 1
    b = pool.add_sequence(1)    # 1 page: 2
    c = pool.add_sequence(200)  # 4 pages: 3..6
    with pytest.raises(ratekv.RatekvError, match=r"needs 2 pages \(fp16 cache\); 1 pages \(64 tokens\) are free of 8"):
        pool.add_sequence(65)
    assert pool.free_pages == 1  # the refused request took nothing
    pool.remove_sequence(a)
    d = pool.add_sequence(128)  # the freed pages, in their order
    assert pool.seq_pages(d) == [0, 1]
    rows = np.zeros((3, 4), dtype=np.int32)
    pool.page_table([c, b, d], rows)
    assert rows.tolist() == [[3, 4, 5, 6], [2, 0, 0, 0], [0, 1, 0, 0]]
    with pytest.raises(ratekv.RatekvError, match="a sequence holds at most 4 pages"):
        pool.add_sequence(257)
    with pytest.raises(ratekv.RatekvError, match=r"rows: shape \(2, 4\), expected \(3, 4\)"):
        pool.page_table([c, b, d], np.zeros((2, 4), dtype=np.int32))
    with pytest.raises(ratekv.RatekvError, match="unknown sequence id 0"):
        pool.remove_sequence(a)


def test_offsets_past_4gib_and_bad_binding():
    pool = _core.PagePool([51200], "K3V3", pages=100000, max_seq_pages=16, pages_descending=True)
    assert pool.layer_bytes(0) == 5_120_000_000
    s = pool.add_sequence(64)
    assert pool.seq_pages(s) == [99999]
    assert pool.page_offset(0, 99999) == 5_119_948_800  # > 2^32: 64-bit
    small = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ratekv.RatekvError, match="16 bytes bound, its 100000 pages of 51200 bytes need 5120000000"):
        pool.bind_layer(0, small.data_ptr(), small.numel())
    with pytest.raises(ratekv.RatekvError, match="no memory bound"):
        pool.layer_base(0)
    with pytest.raises(ratekv.RatekvError, match="PagePoolOptions.pages = 0"):
        _core.PagePool([10], "x", pages=0, max_seq_pages=1)
