#!/usr/bin/env python3
"""Runs smelt-ptx's demo kernels on a real GPU through the CUDA driver API (ctypes, no
toolkit) and checks their results against numpy: proof that the builder's PTX not only
assembles but computes what the Rust that emitted it says.

Usage (on the GPU machine): python3 run_demo.py DIR
DIR holds the PTX that `cargo run -p smelt-ptx --example emit_ptx -- DIR` wrote
(demo_sm_80.ptx, demo_sm_90.ptx) and optionally more *.ptx to check for JIT acceptance.
Fresh random inputs every run, outputs poisoned with NaN before each launch.
"""
import ctypes
import pathlib
import sys

import numpy as np

cuda = ctypes.CDLL("libcuda.so.1")
CU = ctypes.c_void_p


def check(res, what):
    if res != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(res, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {res} {name.value.decode() if name.value else ''}")


check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = CU()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
name = ctypes.create_string_buffer(256)
cuda.cuDeviceGetName(name, 256, dev)
drv = ctypes.c_int()
cuda.cuDriverGetVersion(ctypes.byref(drv))
print(f"device: {name.value.decode()}, driver API {drv.value}")

rng = np.random.default_rng()


def load(ptx: bytes):
    mod = CU()
    log = ctypes.create_string_buffer(8192)
    # CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
    opts = (ctypes.c_int * 2)(5, 6)
    vals = (CU * 2)(ctypes.cast(log, CU), CU(8192))
    res = cuda.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(ptx + b"\0"), 2, opts, vals)
    if res != 0:
        raise RuntimeError(f"cuModuleLoadDataEx: {res}\n{log.value.decode(errors='replace')}")
    return mod


class Buf:
    def __init__(self, nbytes):
        self.ptr = ctypes.c_uint64()
        self.nbytes = nbytes
        check(cuda.cuMemAlloc_v2(ctypes.byref(self.ptr), max(nbytes, 1)), "cuMemAlloc")

    @staticmethod
    def of(array):
        b = Buf(array.nbytes)
        check(cuda.cuMemcpyHtoD_v2(b.ptr, array.ctypes.data_as(CU), array.nbytes), "HtoD")
        return b

    def poison(self):
        check(cuda.cuMemsetD8_v2(self.ptr, 0xFF, self.nbytes), "memset")  # NaN for f32

    def fill_zero(self):
        check(cuda.cuMemsetD8_v2(self.ptr, 0, self.nbytes), "memset")

    def get(self, dtype, count):
        out = np.empty(count, dtype=dtype)
        check(cuda.cuMemcpyDtoH_v2(out.ctypes.data_as(CU), self.ptr, out.nbytes), "DtoH")
        return out

    def free(self):
        cuda.cuMemFree_v2(self.ptr)


def launch(mod, kernel, grid, block, *args):
    fn = CU()
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, kernel.encode()), f"get {kernel}")
    holders = []
    for a in args:
        holders.append(ctypes.c_uint64(a.ptr.value) if isinstance(a, Buf) else ctypes.c_uint32(a))
    params = (CU * len(holders))(*[ctypes.cast(ctypes.byref(h), CU) for h in holders])
    gx, gy, gz = (grid + (1, 1))[:3]
    bx, by, bz = (block + (1, 1))[:3]
    check(cuda.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, 0, None, params, None), f"launch {kernel}")
    check(cuda.cuCtxSynchronize(), f"sync after {kernel}")


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


rows = []


def record(module, kernel, shape, ok, detail):
    rows.append((module, kernel, shape, "ok" if ok else "FAIL", detail))


def test_vector_add(mod, tag):
    n = 1_000_003
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    da, db, dc = Buf.of(a), Buf.of(b), Buf(4 * n)
    dc.poison()
    launch(mod, "vector_add", ((n + 255) // 256,), (256,), da, db, dc, n)
    c = dc.get(np.float32, n)
    same = np.array_equal(c.view(np.uint32), (a + b).view(np.uint32))
    record(tag, "vector_add", f"n={n}", same, "bit-exact" if same else f"{np.sum(c != a + b)} differ")
    for x in (da, db, dc):
        x.free()


def test_vector_add_v4(mod, tag):
    n4 = 250_001
    n = 4 * n4
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    da, db, dc = Buf.of(a), Buf.of(b), Buf(4 * n)
    dc.poison()
    launch(mod, "vector_add_v4", ((n4 + 127) // 128,), (128,), da, db, dc, n4)
    c = dc.get(np.float32, n)
    same = np.array_equal(c.view(np.uint32), (a + b).view(np.uint32))
    record(tag, "vector_add_v4", f"n4={n4}", same, "bit-exact" if same else f"{np.sum(c != a + b)} differ")
    for x in (da, db, dc):
        x.free()


def test_block_sum(mod, tag):
    for n, blocks, threads in [(1_000_003, 264, 256), (77, 3, 64), (5_000_000, 132, 1024)]:
        x = rng.standard_normal(n, dtype=np.float32)
        dx, dout = Buf.of(x), Buf(4)
        dout.fill_zero()
        launch(mod, "block_sum", (blocks,), (threads,), dx, dout, n)
        got = dout.get(np.float32, 1)[0]
        want = np.sum(x, dtype=np.float64)
        err = abs(got - want) / max(np.sum(np.abs(x), dtype=np.float64), 1e-30)
        record(tag, "block_sum", f"n={n} grid={blocks}x{threads}", err < 1e-6, f"|err|/sum|x| = {err:.2e}")
        dx.free()
        dout.free()


def q8_0_blocks(nrows, nblocks):
    d = rng.uniform(1e-3, 2e-2, size=(nrows, nblocks)).astype(np.float16)
    q = rng.integers(-128, 128, size=(nrows, nblocks, 32), dtype=np.int8)
    raw = np.zeros((nrows, nblocks, 34), dtype=np.uint8)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(nrows, nblocks, 2)
    raw[:, :, 2:] = q.view(np.uint8)
    return raw, d, q


def test_q8_0_dot(mod, tag):
    for nrows, nblocks, warps in [(37, 130, 4), (1, 1, 1), (64, 512, 8)]:
        araw, ad, aq = q8_0_blocks(nrows, nblocks)
        braw, bd, bq = q8_0_blocks(1, nblocks)
        da, db, dout = Buf.of(araw), Buf.of(braw), Buf(4 * nrows)
        dout.poison()
        launch(mod, "q8_0_dot_rows", ((nrows + warps - 1) // warps,), (32, warps), da, db, dout, nblocks, nrows)
        got = dout.get(np.float32, nrows)
        isum = np.einsum("rbi,bi->rb", aq.astype(np.int64), bq[0].astype(np.int64))
        want = np.sum(isum * ad.astype(np.float64) * bd[0].astype(np.float64), axis=1)
        err = rel_err(got, want)
        ok = err < 1e-5 and not np.isnan(got).any()
        record(tag, "q8_0_dot_rows", f"{nrows}x{nblocks} blocks, {warps} warps/CTA", ok, f"rel err {err:.2e}")
        for x in (da, db, dout):
            x.free()


def test_q4_0_dequant(mod, tag):
    nblocks = 1001
    d = rng.uniform(-2e-2, 2e-2, size=nblocks).astype(np.float16)
    qs = rng.integers(0, 256, size=(nblocks, 16), dtype=np.uint8)
    raw = np.zeros((nblocks, 18), dtype=np.uint8)
    raw[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    raw[:, 2:] = qs
    dq, dy = Buf.of(raw), Buf(4 * 32 * nblocks)
    dy.poison()
    launch(mod, "q4_0_dequant", ((nblocks + 127) // 128,), (128,), dq, dy, nblocks)
    got = dy.get(np.float32, 32 * nblocks).reshape(nblocks, 32)
    vals = np.concatenate([(qs & 0xF).astype(np.int32) - 8, (qs >> 4).astype(np.int32) - 8], axis=1)
    want = (d.astype(np.float32)[:, None] * vals.astype(np.float32)).astype(np.float32)
    same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
    record(tag, "q4_0_dequant", f"{nblocks} blocks", same, "bit-exact" if same else f"{np.sum(got != want)} differ")
    dq.free()
    dy.free()


def main():
    folder = pathlib.Path(sys.argv[1])
    failures = 0
    for path in sorted(folder.glob("*.ptx")):
        try:
            mod = load(path.read_bytes())
        except RuntimeError as e:
            record(path.name, "(load)", "", False, str(e).splitlines()[0])
            print(e)
            continue
        record(path.name, "(load)", "", True, "JIT ok")
        if path.name.startswith("demo_"):
            for test in (test_vector_add, test_vector_add_v4, test_block_sum, test_q8_0_dot, test_q4_0_dequant):
                try:
                    test(mod, path.name)
                except RuntimeError as e:
                    record(path.name, test.__name__, "", False, str(e))
        cuda.cuModuleUnload(mod)
    print()
    print(f"{'module':<22} {'kernel':<15} {'shape':<36} {'':<4} detail")
    for r in rows:
        print(f"{r[0]:<22} {r[1]:<15} {r[2]:<36} {r[3]:<4} {r[4]}")
        failures += r[3] != "ok"
    print(f"{len(rows) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
