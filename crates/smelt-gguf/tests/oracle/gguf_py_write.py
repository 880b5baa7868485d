"""Writes a GGUF file with gguf-py's GGUFWriter holding every metadata value type, nested
arrays, a custom alignment and a few tensors, for tests/gguf_py.rs to read."""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType as T, GGUFWriter


def main(path):
    w = GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    w.add_key_value("t.u8", 255, T.UINT8)
    w.add_key_value("t.i8", -128, T.INT8)
    w.add_key_value("t.u16", 65535, T.UINT16)
    w.add_key_value("t.i16", -32768, T.INT16)
    w.add_key_value("t.u32", 4294967295, T.UINT32)
    w.add_key_value("t.i32", -2147483648, T.INT32)
    w.add_key_value("t.u64", 18446744073709551615, T.UINT64)
    w.add_key_value("t.i64", -9223372036854775808, T.INT64)
    w.add_key_value("t.f32", 0.1, T.FLOAT32)
    w.add_key_value("t.f64", 0.1, T.FLOAT64)
    w.add_key_value("t.bool", True, T.BOOL)
    w.add_key_value("t.string", "héllo 🦀", T.STRING)
    w.add_key_value("t.array.u8", [1, 2, 255], T.ARRAY, T.UINT8)
    w.add_key_value("t.array.i8", [-1, 2], T.ARRAY, T.INT8)
    w.add_key_value("t.array.u16", [65535], T.ARRAY, T.UINT16)
    w.add_key_value("t.array.i16", [-2, 3], T.ARRAY, T.INT16)
    w.add_key_value("t.array.u32", [7, 8], T.ARRAY, T.UINT32)
    w.add_key_value("t.array.i32", [-7, 8], T.ARRAY, T.INT32)
    w.add_key_value("t.array.u64", [2**64 - 1], T.ARRAY, T.UINT64)
    w.add_key_value("t.array.i64", [-(2**63)], T.ARRAY, T.INT64)
    w.add_key_value("t.array.f32", [0.5, -2.25], T.ARRAY, T.FLOAT32)
    w.add_key_value("t.array.f64", [0.1, 1e300], T.ARRAY, T.FLOAT64)
    w.add_key_value("t.array.bool", [True, False], T.ARRAY, T.BOOL)
    w.add_array("t.array.string", ["a", "", "ü"])
    w.add_array("t.array.nested", [[1, 2], [3]])
    w.add_array("t.array.nested.strings", [["x", "yz"], ["w"]])

    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", np.array([1.0, -2.0], dtype=np.float16))
    q8 = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)
    w.add_tensor("q8_0", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("i32", np.array([[-1, 2], [3, 4], [5, 6]], dtype=np.int32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
