"""TFRecord files of tf.train.Examples, read without TensorFlow, so that a
bad file is one line before TensorFlow loads: each file's records counted,
their labels read and their images checked (images.check), once per file;
the result is cached by file (path, size, modification time), so that later
runs, and the other processes on a host, read it at once.

The format (TensorFlow's tfrecord_writer): per record a uint64 length, its
masked CRC-32C, the data, the data's masked CRC-32C, little-endian. The data
is a serialized tf.train.Example: Features{map<string, Feature> feature = 1};
Feature{BytesList bytes_list = 1; FloatList float_list = 2; Int64List
int64_list = 3}. Only the two features asked for are decoded; the rest,
the image bytes included, are stepped over.
"""
import os
import struct
from dataclasses import dataclass

import numpy as np

from ringtrain.common.errors import UsageError
from ringtrain.workloads import images
from ringtrain.workloads.cache import cached

# tf_cnn_benchmarks' and the official model garden's ImageNet records
IMAGE_KEY, LABEL_KEY = "image/encoded", "image/class/label"
_CRC_TABLE = []


@dataclass
class FileIndex:
    labels: np.ndarray   # int64, one per record
    bad: np.ndarray      # indices of records whose image does not decode
    reasons: list        # why, for each of `bad`


def index(path, image_key=IMAGE_KEY, label_key=LABEL_KEY):
    """A file's FileIndex (cached), or a UsageError naming the file and the fix."""
    stat = os.stat(path)
    key = ("tfrecord", os.path.abspath(path), stat.st_size, stat.st_mtime_ns, image_key, label_key, 1)
    found = cached(key, lambda: _scan(path, image_key, label_key))
    return FileIndex(found["labels"], found["bad"], list(found["reasons"]))


def _scan(path, image_key, label_key):
    labels, bad, reasons = [], [], []
    wanted = {image_key.encode(), label_key.encode()}
    for number, record in enumerate(records(path)):
        record = memoryview(record)
        found = _features(record, wanted)
        missing = [k for k in (image_key, label_key) if k.encode() not in found]
        if missing:
            present = sorted(_feature_keys(record))
            raise UsageError(f"{path}: record {number} has no feature {missing[0]!r} (its features: "
                             f"{', '.join(present) or 'none'}): give --image-key and --label-key")
        label = _int64(record, *found[label_key.encode()])
        if label is None:
            raise UsageError(f"{path}: record {number}'s {label_key!r} is not one integer: give --label-key "
                             "naming an int64 feature of one class index")
        labels.append(label)
        image = _bytes(record, *found[image_key.encode()])
        why = images.check(bytes(image[:16]), bytes(image[-images.TAIL:]), len(image)) if image is not None \
            else f"{image_key!r} is not a bytes feature"
        if why:
            bad.append(number)
            reasons.append(why)
    return {"labels": np.asarray(labels, np.int64), "bad": np.asarray(bad, np.int64), "reasons": reasons}


def records(path):
    """Each record's data (bytes) of a TFRecord file, in order."""
    with open(path, "rb", buffering=1 << 20) as f:
        number = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise UsageError(f"{path} is cut short after record {number - 1}: not a whole TFRecord file")
            length, length_crc = struct.unpack("<QI", header)
            if number == 0 and length_crc != masked_crc(header[:8]):
                raise UsageError(f"{path} is not a TFRecord file (or a compressed one): give uncompressed "
                                 "TFRecord files of tf.train.Example, as TFRecordWriter writes them")
            record = f.read(length)
            if len(record) < length or len(f.read(4)) < 4:
                raise UsageError(f"{path} is cut short in record {number}: not a whole TFRecord file")
            yield record
            number += 1


def masked_crc(data):
    """TFRecord's masked CRC-32C (Castagnoli) of `data`."""
    if not _CRC_TABLE:
        for i in range(256):
            crc = i
            for _ in range(8):
                crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            _CRC_TABLE.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- protocol buffers' wire format, as far as tf.train.Example needs it ---------------

def _varint(buf, pos):
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start, end):
    """(field number, wire type, start, end) of a message's fields; a varint's
    value is its `start`."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _varint(buf, pos)
            yield number, wire, pos, pos + length
            pos += length
        elif wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value, None
        elif wire in (1, 5):
            yield number, wire, pos, None
            pos += 8 if wire == 1 else 4
        else:
            raise UsageError("a record is not a serialized tf.train.Example (bad wire type)")
        if pos > end:
            raise UsageError("a record is not a serialized tf.train.Example (a field runs past its end)")


def _entries(record):
    """(key bytes, (start, end) of its Feature) of an Example's features."""
    try:
        for number, wire, start, end in _fields(record, 0, len(record)):
            if number != 1 or wire != 2:
                continue
            for n, w, s, e in _fields(record, start, end):
                if n == 1 and w == 2:
                    key = value = None
                    for n3, w3, s3, e3 in _fields(record, s, e):
                        if n3 == 1 and w3 == 2:
                            key = bytes(record[s3:e3])
                        elif n3 == 2 and w3 == 2:
                            value = (s3, e3)
                    yield key, value
    except IndexError:
        raise UsageError("a record is not a serialized tf.train.Example (it ends inside a field)") from None


def _features(record, wanted):
    return {key: value for key, value in _entries(record) if key in wanted and value is not None}


def _feature_keys(record):
    return [key.decode(errors="replace") for key, _ in _entries(record) if key is not None]


def _inner(record, start, end, kind):
    """The (start, end) of a Feature's list of `kind` (1 bytes, 2 float, 3 int64), or None."""
    for number, wire, s, e in _fields(record, start, end):
        if number == kind and wire == 2:
            return s, e
    return None


def _int64(record, start, end):
    """A Feature's one int64, or None."""
    inner = _inner(record, start, end, 3)
    if inner is None:
        return None
    values = []
    for number, wire, s, e in _fields(record, *inner):
        if number == 1 and wire == 0:
            values.append(s)
        elif number == 1 and wire == 2:  # packed
            pos = s
            while pos < e:
                value, pos = _varint(record, pos)
                values.append(value)
    if len(values) != 1:
        return None
    return values[0] - (1 << 64) if values[0] >= 1 << 63 else values[0]


def _bytes(record, start, end):
    """A Feature's first bytes value (a memoryview), or None."""
    inner = _inner(record, start, end, 1)
    if inner is None:
        return None
    for number, wire, s, e in _fields(record, *inner):
        if number == 1 and wire == 2:
            return record[s:e]
    return None
