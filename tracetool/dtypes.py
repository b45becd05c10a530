"""Bytes per element of the dtype names traces use (c10 names, Input type strings, NCCL
kernel suffixes), lower-cased: one table for collectives' sizes and kernels' work."""

ELEM_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4, "double": 8, "float64": 8,
    "long": 8, "long int": 8, "long long": 8, "int64": 8, "uint64": 8, "unsigned long": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2,
    "int16": 2, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "unsigned char": 1,
    "signed char": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}
