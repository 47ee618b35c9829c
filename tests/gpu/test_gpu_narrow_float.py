"""The compressed exchange's conversions on the GPU (gpu::copy_rows with
cc/narrow_float.h) equal PyTorch's casts, on the GPU and on the CPU, bit for
bit (NaN as NaN): every 16-bit pattern widened, 16M random float32 bit
patterns and the ties and limits narrowed. The CPU twin is held to
tf.cast the same way (tests/test_compressed_exchange.py), so both twins agree."""
import numpy as np
import pytest

from sokev_gpu_reference import SKIP_REASON

if SKIP_REASON is None:
    import torch
    import sokev_gpu as sg

FORMATS = ["bfloat16", "float16"]


def _torch_dtype(fmt):
    return torch.bfloat16 if fmt == "bfloat16" else torch.float16


def _assert_same_floats(got, expected):
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_widening_every_16_bit_pattern_equals_torch(fmt):
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    got = sg.convert_16(bits.cuda(), fmt).cpu().numpy()
    for device in ("cpu", "cuda"):
        expected = bits.to(device).view(_torch_dtype(fmt)).float().cpu().numpy()
        _assert_same_floats(got, expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_narrowing_random_float_bit_patterns_equals_torch(fmt):
    rng = np.random.default_rng(12)
    patterns = rng.integers(0, 1 << 32, size=1 << 24, dtype=np.uint64).astype(np.uint32)
    specials = np.array([
        0.0, 1.0, 65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 1e-40,
        3.4028235e38, np.inf, np.nan, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11
    ], np.float32)
    x = np.concatenate([patterns.view(np.float32), specials, -specials])
    got = sg.convert_16(torch.from_numpy(x).cuda(), fmt).cpu()
    for device in ("cpu", "cuda"):
        expected = torch.from_numpy(x).to(device).to(_torch_dtype(fmt)).view(torch.int16).cpu()
        # Compared as floats: NaN only has to stay NaN.
        _assert_same_floats(
            got.view(_torch_dtype(fmt)).float().numpy(),
            expected.view(_torch_dtype(fmt)).float().numpy())
        finite = ~np.isnan(expected.view(_torch_dtype(fmt)).float().numpy())
        np.testing.assert_array_equal(got.numpy()[finite], expected.numpy()[finite])
