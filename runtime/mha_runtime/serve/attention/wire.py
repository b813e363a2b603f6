"""The HTTP wire format of `POST /v1/context`: JSON or raw .npy bodies to arrays and back, and the body limit.

Both sides use it: the server decodes requests and encodes answers, the load test does the reverse.
"""
from __future__ import annotations

import io
import itertools
import json
import math
import sys
from tokenize import TokenError
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import RequestError, cut, first_line
from mha_runtime.artifact.fields import DuplicateKeyError, unique_keys
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.attention.npy import npy_bytes
from mha_runtime.serve.http import JSON, media_type

NPY = "application/x-npy"
FORMATS = {"npy": NPY, "json": JSON}
# The body limit, per format: max_batch x context_length x d_in values at VALUE_BYTES[format] each, plus
# HEADER_BYTES of room for the npy header or JSON brackets. JSON: a float32 written as text,
# "-0.12345678901234567, ", is at most about 26 bytes, so 32. npy: float32, 4; a float64 .npy (which the
# contract casts) is held to the same bytes, so it carries half the values.
JSON_VALUE_BYTES = 32
VALUE_BYTES = {"json": JSON_VALUE_BYTES, "npy": 4}
HEADER_BYTES = 4096
NPY_MAGIC = b"\x93NUMPY"


def body_limit(config: MHAConfig, max_batch: int, fmt: str) -> int:
    """The largest request body accepted in format 'json' or 'npy', in bytes: a full batch of full-length inputs."""
    return HEADER_BYTES + max_batch * config.context_length * config.d_in * VALUE_BYTES[fmt]


def limit_reason(config: MHAConfig, max_batch: int, fmt: str) -> str:
    """How body_limit's figure is made, for the 413 line."""
    return (f"max batch {max_batch} x context_length {config.context_length} x d_in {config.d_in} values at "
            f"{VALUE_BYTES[fmt]} bytes each as {fmt}, plus {HEADER_BYTES}")


def request_format(content_type: str | None) -> str:
    """A request's Content-Type -> 'npy' or 'json' (no Content-Type is JSON); RequestError (400) for another."""
    kind = media_type(content_type)
    if kind == NPY:
        return "npy"
    if kind not in (JSON, ""):
        raise RequestError(f"Content-Type: expected {JSON} or {NPY}, got {kind!r}")
    return "json"


def load_json(body: bytes, where: str) -> Any:
    """A JSON document, or RequestError saying what is wrong with it (never Python's own advice)."""
    try:
        return json.loads(body, object_pairs_hook=unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, DuplicateKeyError) as exc:
        raise RequestError(f"{where}: expected JSON ({first_line(exc)})") from None
    except ValueError:  # json.loads refuses integers of over sys.get_int_max_str_digits() digits
        raise RequestError(f"{where}: expected JSON integers of at most {sys.get_int_max_str_digits()} "
                           f"digits") from None


def decode_request(body: bytes, content_type: str | None) -> tuple[np.ndarray, str]:
    """A request body -> (array, answer format 'npy' or 'json'); RequestError (400) saying what is malformed.

    The array is numeric but not yet checked against the contract (the runner's check_input does that).
    """
    if request_format(content_type) == "npy":
        return read_npy(body, "body"), "npy"
    doc = load_json(body, "body")
    expected = f'body: expected a JSON object {{"{INPUT_NAME}": [[[...]]]}}'
    if not isinstance(doc, dict):
        raise RequestError(expected)
    # Unknown keys are refused, not ignored: a client's misspelt or extra field is a mistake it should hear about.
    unknown = sorted(set(doc) - {INPUT_NAME})
    if unknown:
        shown = ", ".join(repr(cut(key)) for key in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RequestError(f"{expected}, got unknown key{'s' if len(unknown) > 1 else ''} {shown}{more}")
    if INPUT_NAME not in doc:
        raise RequestError(expected)
    return json_array(doc[INPUT_NAME], repr(INPUT_NAME)), "json"


def json_array(value: Any, where: str) -> np.ndarray:
    """Nested JSON lists of numbers -> float64 array (check_input casts to float32); bools and strings refused."""
    try:
        array = np.asarray(value)  # no dtype=: float32 would turn "1.5" and true into numbers
    except (ValueError, RecursionError) as exc:  # ragged nesting: "inhomogeneous shape"
        raise RequestError(f"{where}: expected a rectangular nested list of numbers ({first_line(exc)})") from None
    if array.dtype.kind not in "iuf":
        raise RequestError(f"{where}: expected numbers, got JSON values of numpy kind {array.dtype.kind!r}")
    # numpy reads true and false beside numbers as 1 and 0 (kind 'i' or 'f'): a silently wrong input. The leaves
    # are the nested lists flattened ndim - 1 times; map(type) over them costs about 8% of json.loads's time.
    leaves: Any = value
    for _ in range(array.ndim - 1):
        leaves = itertools.chain.from_iterable(leaves)
    if array.ndim and bool in set(map(type, leaves)):
        raise RequestError(f"{where}: expected numbers, got true or false among them")
    return array.astype(np.float64, copy=False)


def read_npy(body: bytes, where: str) -> np.ndarray:
    """A .npy file's bytes -> array. The header is read first and its byte count checked against the body,
    so a header that claims a huge shape allocates nothing."""
    if not body.startswith(NPY_MAGIC):
        raise RequestError(f"{where}: expected a .npy file (no \\x93NUMPY magic)")
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"format version {version[0]}.{version[1]}, expected 1.0 or 2.0 (np.save)")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(stream)
    except (ValueError, SyntaxError, EOFError, OSError, TokenError, RecursionError) as exc:  # numpy's header parser
        raise RequestError(f"{where}: expected a .npy file ({cut(first_line(exc), 120)})") from None
    if dtype.hasobject:
        raise RequestError(f"{where}: expected a numeric .npy array, got dtype {dtype} (pickled objects refused)")
    said = cut(str(list(shape)), 80)
    if any(size < 0 for size in shape):
        raise RequestError(f"{where}: the .npy header says shape {said}, a dimension below 0")
    count = math.prod(shape)  # Python ints: a product past int64 cannot wrap round to the body's size
    offset = stream.tell()
    if len(body) - offset != count * dtype.itemsize:
        raise RequestError(f"{where}: the .npy header says shape {said} {dtype} ({cut(str(count * dtype.itemsize))} "
                           f"bytes), the body holds {len(body) - offset}")
    try:
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        array = array.reshape(shape, order="F" if fortran else "C")
    except ValueError as exc:  # an empty array with a dimension past numpy's limit
        raise RequestError(f"{where}: the .npy header's shape {said} is not one numpy can hold ({first_line(exc)})"
                           ) from None
    return array.astype(dtype.newbyteorder("="))  # a native-order copy (writable; '>f4' becomes float32)


def encode_request(x: np.ndarray, fmt: str) -> tuple[bytes, str]:
    """An input array -> (body, Content-Type) in 'npy' or 'json'."""
    if fmt == "npy":
        return npy_bytes(x), NPY
    return json.dumps({INPUT_NAME: x.tolist()}).encode(), JSON


def encode_answer(context: np.ndarray, fmt: str) -> tuple[bytes, str]:
    """The output -> (body, Content-Type), in the format the request came in."""
    if fmt == "npy":
        return npy_bytes(context), NPY
    return json.dumps({OUTPUT_NAME: context.tolist()}).encode(), JSON


def decode_answer(body: bytes, content_type: str | None) -> np.ndarray:
    """An answer body -> float32 array; RequestError when it is neither a .npy file nor {"context": [...]}."""
    if media_type(content_type) == NPY:
        return read_npy(body, "answer")
    doc = load_json(body, "answer")
    if not isinstance(doc, dict) or OUTPUT_NAME not in doc:
        raise RequestError(f'answer: expected a JSON object {{"{OUTPUT_NAME}": [[[...]]]}}')
    return json_array(doc[OUTPUT_NAME], f"answer {OUTPUT_NAME!r}").astype(np.float32)
