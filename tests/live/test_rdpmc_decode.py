"""perf_mmap_read_self on crafted perf_event_mmap_page bytes, expected values computed here."""
import ctypes
import mmap
import os

import pytest

from instrument.live import perf_ctypes as _perf_ctypes

try:
    from instrument import _native
    _native.CounterGroup
except (ImportError, AttributeError):  # extension not built, or built without csrc/perf.c
    _native = None

pytestmark = pytest.mark.skipif(_native is None, reason="instrument._native is not built")

U64 = (1 << 64) - 1


class perf_event_mmap_page(ctypes.Structure):
    """Mirror of struct perf_event_mmap_page in linux/perf_event.h."""
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("compat_version", ctypes.c_uint32),
        ("lock", ctypes.c_uint32),
        ("index", ctypes.c_uint32),
        ("offset", ctypes.c_int64),
        ("time_enabled", ctypes.c_uint64),
        ("time_running", ctypes.c_uint64),
        ("cap_bit0", ctypes.c_uint64, 1),
        ("cap_bit0_is_deprecated", ctypes.c_uint64, 1),
        ("cap_user_rdpmc", ctypes.c_uint64, 1),
        ("cap_user_time", ctypes.c_uint64, 1),
        ("cap_user_time_zero", ctypes.c_uint64, 1),
        ("cap_user_time_short", ctypes.c_uint64, 1),
        ("cap_____res", ctypes.c_uint64, 58),
        ("pmc_width", ctypes.c_uint16),
        ("time_shift", ctypes.c_uint16),
        ("time_mult", ctypes.c_uint32),
        ("time_offset", ctypes.c_uint64),
        ("time_zero", ctypes.c_uint64),
        ("size", ctypes.c_uint32),
        ("__reserved_1", ctypes.c_uint32),
        ("time_cycles", ctypes.c_uint64),
        ("time_mask", ctypes.c_uint64),
        ("__reserved", ctypes.c_uint8 * (116 * 8)),
        ("data_head", ctypes.c_uint64),
        ("data_tail", ctypes.c_uint64),
        ("data_offset", ctypes.c_uint64),
        ("data_size", ctypes.c_uint64),
        ("aux_head", ctypes.c_uint64),
        ("aux_tail", ctypes.c_uint64),
        ("aux_offset", ctypes.c_uint64),
        ("aux_size", ctypes.c_uint64),
    ]


def test_layout_matches_the_header():
    assert perf_event_mmap_page.data_head.offset == 1024
    assert perf_event_mmap_page.pmc_width.offset == 48
    assert perf_event_mmap_page.time_cycles.offset == 80
    p = perf_event_mmap_page(cap_user_rdpmc=1, cap_user_time_short=1)
    assert int.from_bytes(bytes(p)[40:48], "little") == (1 << 2) | (1 << 5)


def page(**fields):
    fields.setdefault("cap_user_rdpmc", 1)
    fields.setdefault("pmc_width", 48)
    fields.setdefault("lock", 2)
    return bytes(perf_event_mmap_page(**fields))


def decode(pg, pmc=0, tsc=0):
    return _native._perf_mmap_decode(pg, pmc, tsc)


def sext(v, width):
    v &= (1 << width) - 1
    return v - (1 << width) if v >> (width - 1) else v


def test_index_zero_means_not_readable():
    assert decode(page(index=0, offset=5), pmc=123) is None


def test_no_cap_user_rdpmc_means_not_readable():
    assert decode(page(index=1, cap_user_rdpmc=0), pmc=123) is None


def test_short_page_rejected():
    with pytest.raises(ValueError):
        decode(b"\0" * 64)


def test_counter_passed_is_index_minus_one():
    fixed = (1 << 30) | 1  # x86 fixed counters carry bit 30 in the rdpmc index
    assert decode(page(index=fixed + 1), pmc=7)[3] == fixed
    assert decode(page(index=3), pmc=7)[3] == 2


@pytest.mark.parametrize("raw", [5, (1 << 48) - 5, (1 << 47), (1 << 47) - 1, 0xFFFF_0000_0000_1234, U64])
@pytest.mark.parametrize("offset", [0, 1000, -(1 << 40)])
def test_pmc_width_sign_extension_plus_offset(raw, offset):
    v, e, r, _ = decode(page(index=1, offset=offset, time_enabled=10, time_running=10), pmc=raw)
    assert v == (offset + sext(raw, 48)) & U64
    assert (e, r) == (10, 10)  # no cap_user_time: the page's times as they are


def test_full_width_counter_is_not_extended():
    assert decode(page(index=1, pmc_width=64, offset=1), pmc=1 << 63)[0] == (1 << 63) + 1


def test_lock_value_does_not_matter_when_stable():
    for lock in (0, 1, 12345, 0xFFFFFFFF):
        assert decode(page(index=1, lock=lock), pmc=9)[0] == 9


def expected_times(enabled, running, tsc, mult, shift, offset, cycles=0, mask=U64, short=False):
    cyc = (cycles + ((tsc - cycles) & mask)) & U64 if short else tsc
    delta = (offset + ((cyc * mult) >> shift)) & U64
    return (enabled + delta) & U64, (running + delta) & U64


@pytest.mark.parametrize("tsc,mult,shift,offset", [
    (1_000_000, 1 << 20, 20, 0),                          # 1 ns per cycle
    (3_000_000_123, 699_050_667, 31, (-(10**12)) & U64),  # ~3 GHz TSC, offset below zero as the kernel stores it
    (1 << 40, (1 << 32) - 1, 10, 12345),                  # the cyc*mult product needs more than 64 bits
])
def test_time_extrapolation(tsc, mult, shift, offset):
    enabled, running = 5_000_000_000_000, 2_500_000_000_000
    pg = page(index=2, offset=100, cap_user_time=1, time_enabled=enabled, time_running=running,
              time_mult=mult, time_shift=shift, time_offset=offset)
    v, e, r, _ = decode(pg, pmc=50, tsc=tsc)
    assert v == 150  # raw: scaling is the caller's job
    assert (e, r) == expected_times(enabled, running, tsc, mult, shift, offset)


def test_time_extrapolation_with_short_cycles():
    cycles, mask = 0xFFFF_FF00, (1 << 32) - 1
    tsc = 0x10  # a 32-bit counter that wrapped since time_cycles was taken
    pg = page(index=1, cap_user_time=1, cap_user_time_short=1, time_enabled=100, time_running=100,
              time_mult=3 << 29, time_shift=30, time_offset=7, time_cycles=cycles, time_mask=mask)
    _, e, r, _ = decode(pg, pmc=0, tsc=tsc)
    assert (e, r) == expected_times(100, 100, tsc, 3 << 29, 30, 7, cycles, mask, short=True)
    assert e != expected_times(100, 100, tsc, 3 << 29, 30, 7)[0]


def test_real_software_page_is_not_rdpmc_readable():
    fd = _perf_ctypes.perf_event_open(1, 1)  # task-clock
    assert fd >= 0
    try:
        m = mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
        raw = bytes(m[:ctypes.sizeof(perf_event_mmap_page)])
        m.close()
    finally:
        os.close(fd)
    pg = perf_event_mmap_page.from_buffer_copy(raw)
    assert pg.cap_user_rdpmc == 0 and pg.index == 0
    assert decode(raw, pmc=1, tsc=1) is None


# ------------------------------------------- thread CPU time from the page's clock (cap_user_time)
def time_decode(pg, tsc):
    return _native._perf_mmap_time_decode(pg, tsc)


def test_time_is_none_without_cap_user_time():
    assert time_decode(page(cap_user_time=0, time_enabled=5_000), 10**9) is None


@pytest.mark.parametrize("tsc,mult,shift,offset", [
    (10**9, 1 << 31, 31, 0),                      # 1 ns per cycle
    (3_000_000_123, 2_863_311_531, 33, 7_777),    # a 3 GHz TSC: mult/2^shift = 1/3
    (2**62 + 12345, 1_431_655_765, 32, U64 - 10**6),   # a large TSC; a negative offset (two's complement)
])
def test_time_is_enabled_time_extrapolated_from_the_tsc(tsc, mult, shift, offset):
    ena = 123_456_789
    got = time_decode(page(cap_user_time=1, time_enabled=ena, time_mult=mult, time_shift=shift,
                           time_offset=offset), tsc)
    assert got == (ena + offset + ((tsc * mult) >> shift)) & U64


def test_time_short_counter_wraps_from_time_cycles():
    # cap_user_time_short: the TSC is narrower than 64 bits; cycles count from time_cycles within time_mask
    cyc, mask, tsc = 0x1_0000_0000, (1 << 32) - 1, 0x2_0000_0010
    got = time_decode(page(cap_user_time=1, cap_user_time_short=1, time_enabled=0, time_mult=1 << 20,
                           time_shift=20, time_offset=0, time_cycles=cyc, time_mask=mask), tsc)
    assert got == cyc + ((tsc - cyc) & mask)


def test_the_fast_thread_clock_agrees_with_clock_thread_cputime():
    """Where perf_event_open allows it, calibrate() validates the thread's task-clock (its mmap page where the
    kernel offers cap_user_time, else read()) against the thread CPU clock and stages read it; else it says why not."""
    import instrument
    import time
    instrument.configure(counters="none")
    c = _native.calibrate()
    if not c["thread_clock"].startswith("perf task-clock"):
        pytest.skip(f"thread CPU clock here: {c['thread_clock']}")
    st = instrument.stage("spin")
    inner = 0
    t = time.thread_time_ns()
    for _ in range(50):
        with st:
            b = time.thread_time_ns()
            end = b + 200_000
            while (now := time.thread_time_ns()) < end:
                pass
            inner += now - b
    outer = time.thread_time_ns() - t
    # between the thread clock read inside each body and around the whole loop (which holds the SDK's own reads,
    # whatever load makes them cost), give or take 2 % for the two clocks' accounting
    assert 0.98 * inner <= instrument.snapshot()["spin"].cpu_total <= 1.02 * outer, (inner, outer)
