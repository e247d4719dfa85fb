import pytest

from oscar_sgl import OscarConfig, OscarConfigError


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bits": 3}, "bits must be 2 or 4"),
        ({"bits": 8}, "bits must be 2 or 4"),
        ({"k_group": 24}, "k_group must be a positive power of two"),
        ({"v_group": 0}, "v_group must be a positive power of two"),
        ({"page_size": 100}, r"page_size must be a positive multiple of k_group \(32\), got 100"),
        ({"page_size": 0}, r"page_size must be a positive multiple of k_group \(32\), got 0"),
        ({"k_group": 2**31}, r"k_group must be below 2\^31, got 2147483648"),
        ({"page_size": -32}, "page_size must be a positive multiple"),
        ({"norm_scope": "rank"}, "norm_scope must be 'layer' or 'head'"),
        ({"bits": True}, "bits must be an int"),
        ({"bits": 2.0}, "bits must be an int"),
        ({"offset": "zero"}, "offset must be one of 'integer', 'min', got 'zero'"),
        ({"clip": "all"}, "clip must be one of 'none', 'keys', 'values', 'both', got 'all'"),
        ({"clip": None}, "clip must be one of 'none', 'keys', 'values', 'both', got None"),
    ],
)
def test_bad_config_rejected_at_construction(kwargs, match):
    with pytest.raises(OscarConfigError, match=match):
        OscarConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"bits": 3}, "--oscar-bits must be 2 or 4, got 3"),
        ({"k_group": 7}, "--oscar-k-group must be a positive power of two, got 7"),
        ({"page_size": 100}, "--oscar-page-size must be a positive multiple of --oscar-k-group (32), got 100: "
                             "a page is sealed whole, and no key group may straddle a seal"),
        ({"page_size": 0}, "--oscar-page-size must be a positive multiple of --oscar-k-group (32), got 0: "
                           "a page is sealed whole, and no key group may straddle a seal"),
        ({"k_group": 16, "page_size": 40}, "--oscar-page-size must be a positive multiple of --oscar-k-group (16), "
                                           "got 40: a page is sealed whole, and no key group may straddle a seal"),
    ],
)
def test_from_flags_names_the_flags(kwargs, message):
    flags = {"bits": "--oscar-bits", "k_group": "--oscar-k-group", "page_size": "--oscar-page-size"}
    with pytest.raises(OscarConfigError) as e:
        OscarConfig.from_flags(flags, **kwargs)
    assert str(e.value) == message


def test_seal_options_name_their_flags_and_label_the_config():
    flags = {"offset": "--oscar-offset", "clip": "--oscar-clip"}
    with pytest.raises(OscarConfigError) as e:
        OscarConfig.from_flags(flags, clip="keys-and-values")
    assert str(e.value) == "--oscar-clip must be one of 'none', 'keys', 'values', 'both', got 'keys-and-values'"
    with pytest.raises(OscarConfigError) as e:
        OscarConfig.from_flags(flags, offset="max")
    assert str(e.value) == "--oscar-offset must be one of 'integer', 'min', got 'max'"
    assert (OscarConfig().offset, OscarConfig().clip, OscarConfig().label) == ("integer", "none", "oscar")
    assert OscarConfig.for_method("kivi", offset="min", clip="values").label == "kivi+min+clip-values"
    assert [(OscarConfig(clip=c).clip_keys, OscarConfig(clip=c).clip_values) for c in ("none", "keys", "values", "both")] == [
        (False, False), (True, False), (False, True), (True, True)]


def test_from_flags_builds_the_same_config():
    assert OscarConfig.from_flags({}, bits=4, page_size=64) == OscarConfig(bits=4, page_size=64)
    assert OscarConfig.from_flags({"bits": "--bits"}, bits=4, rotation=False) == OscarConfig(bits=4, rotation=False)


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        OscarConfig(bits=3)


@pytest.mark.parametrize("head_dim, match", [(96, "power of two"), (48, "power of two")])
def test_bad_head_dim_rejected(head_dim, match):
    with pytest.raises(OscarConfigError, match=match):
        OscarConfig().check_shape(8, head_dim)


def test_v_group_must_divide_head_dim():
    with pytest.raises(OscarConfigError, match=r"the value group \(v_group 128\) must divide the model's head_dim, got 64"):
        OscarConfig(v_group=128).check_shape(3, 64)


def test_bytes_per_token_matches_spec_table():
    # docs/OSCAR.md §3, Llama-3.1-8B shape: 96.5 B (INT2) and 160.5 B (INT4) per token per layer.
    assert OscarConfig(bits=2).bytes_per_token(8, 128) == pytest.approx(8 * 96.5)
    assert OscarConfig(bits=4).bytes_per_token(8, 128) == pytest.approx(8 * 160.5)
    assert OscarConfig(bits=2).effective_bits(8, 128) == pytest.approx(3.0156, abs=1e-4)
    assert OscarConfig(bits=4).effective_bits(8, 128) == pytest.approx(5.0156, abs=1e-4)
    # No token scales stored without token scaling.
    assert OscarConfig.for_method("kivi", bits=2).effective_bits(8, 128) == pytest.approx(3.0)
    # G_K = 128 brings INT2 to ~84 B per head (spec: "6.1x"; exactly 84.5 B, 6.06x).
    assert OscarConfig(k_group=128).bytes_per_token(8, 128) / 8 == pytest.approx(84.5)


def test_methods():
    assert OscarConfig.for_method("kivi").method == "kivi"
    assert (OscarConfig.for_method("rotation-only").rotation, OscarConfig.for_method("rotation-only").token_scaling) == (True, False)
    assert OscarConfig.for_method("scaling-only").method == "scaling-only"
    with pytest.raises(OscarConfigError, match="unknown method"):
        OscarConfig.for_method("turbo")
