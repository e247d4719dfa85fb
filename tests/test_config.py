import pytest

from oscar_sgl import OscarConfig, OscarConfigError
from oscar_sgl.config import FORMAT_FIELDS, INT2_FORMAT, PAPER_FORMAT


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bits": 3}, "bits must be 2 or 4"),
        ({"bits": 8}, "bits must be 2 or 4"),
        ({"k_group": 24}, "k_group must be a positive power of two"),
        ({"v_group": 0}, "v_group must be a positive power of two"),
        ({"page_size": 100}, r"page_size must be a positive multiple of k_group \(16\), got 100"),
        ({"bits": 4, "page_size": 0}, r"page_size must be a positive multiple of k_group \(32\), got 0"),
        ({"k_group": 2**31}, r"k_group must be below 2\^31, got 2147483648"),
        ({"page_size": -32}, "page_size must be a positive multiple"),
        ({"norm_scope": "rank"}, "norm_scope must be 'layer' or 'head'"),
        ({"bits": True}, "bits must be an int"),
        ({"bits": 2.0}, "bits must be an int"),
        ({"offset": "zero"}, "offset must be one of 'integer', 'min', got 'zero'"),
        ({"clip": "all"}, "clip must be one of 'none', 'keys', 'values', 'both', got 'all'"),
        ({"clip": "keys"}, "clip 'keys' clips key groups, which key_ranges 'page' \\(the INT2 default\\)"),
        ({"key_ranges": "pages"}, "key_ranges must be one of 'group', 'page', got 'pages'"),
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
        ({"page_size": 100}, "--oscar-page-size must be a positive multiple of --oscar-k-group (16), got 100: "
                             "a page is sealed whole, and no key group may straddle a seal"),
        ({"bits": 4, "page_size": 0}, "--oscar-page-size must be a positive multiple of --oscar-k-group (32), got 0: "
                                      "a page is sealed whole, and no key group may straddle a seal"),
        ({"rotation": False, "token_scaling": False, "page_size": 48},
         "--oscar-page-size must be a positive multiple of --oscar-k-group (32), got 48: "
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
    assert (OscarConfig().offset, OscarConfig().clip, OscarConfig().label) == ("min", "values", "oscar+min+clip-values+page-ranges")
    assert (OscarConfig(bits=4).offset, OscarConfig(bits=4).clip, OscarConfig(bits=4).label) == ("integer", "none", "oscar")
    assert OscarConfig.for_method("kivi", offset="min", clip="values").label == "kivi+min+clip-values"
    assert [(OscarConfig(bits=4, clip=c).clip_keys, OscarConfig(bits=4, clip=c).clip_values)
            for c in ("none", "keys", "values", "both")] == [
        (False, False), (True, False), (False, True), (True, True)]


def test_from_flags_builds_the_same_config():
    assert OscarConfig.from_flags({}, bits=4, page_size=64) == OscarConfig(bits=4, page_size=64)
    assert OscarConfig.from_flags({"bits": "--bits"}, bits=4, rotation=False) == OscarConfig(bits=4, rotation=False)
    # A flag not given is None: the field's default, by bits and method.
    assert OscarConfig.from_flags({}, bits=2, k_group=None, clip=None) == OscarConfig(bits=2)
    assert OscarConfig.from_flags({}, bits=2, k_group=32) == OscarConfig(bits=2, k_group=32)


def test_format_defaults_depend_on_bits_and_method():
    """INT2: the page-grid format (the lowest ΔPPL per bit measured); INT4 and kivi: the paper's."""
    fmt = lambda c: {f: getattr(c, f) for f in FORMAT_FIELDS}  # noqa: E731
    assert fmt(OscarConfig()) == fmt(OscarConfig(bits=2)) == INT2_FORMAT
    assert fmt(OscarConfig(bits=4)) == PAPER_FORMAT
    assert fmt(OscarConfig.for_method("kivi")) == fmt(OscarConfig.for_method("kivi", bits=4)) == PAPER_FORMAT
    for m in ("oscar", "rotation-only", "scaling-only"):
        assert fmt(OscarConfig.for_method(m)) == INT2_FORMAT, m
    # Each field set explicitly wins; the others keep their default.
    c = OscarConfig(bits=2, k_group=32, key_ranges="group")
    assert (c.k_group, c.v_group, c.key_ranges, c.offset, c.clip) == (32, 64, "group", "min", "values")
    # A built config holds concrete values: it round-trips, and replace() keeps the format.
    assert OscarConfig(**OscarConfig().to_dict()) == OscarConfig()
    assert OscarConfig(**OscarConfig(bits=4).to_dict()) == OscarConfig(bits=4)
    assert fmt(OscarConfig().replace(bits=4)) == INT2_FORMAT
    assert None not in OscarConfig().to_dict().values()
    # Both defaults stay at or below 3.1 effective bits (INT2) on SmolLM2's and Llama-3.1-8B's shapes.
    assert OscarConfig().effective_bits(3, 64) == pytest.approx(2.9583, abs=1e-4)
    assert OscarConfig().effective_bits(8, 128) == pytest.approx(2.8906, abs=1e-4)


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
    # docs/OSCAR.md §3, Llama-3.1-8B shape: 96.5 B (INT2) and 160.5 B (INT4) per token per layer,
    # in the paper's format.
    assert OscarConfig(bits=2, **PAPER_FORMAT).bytes_per_token(8, 128) == pytest.approx(8 * 96.5)
    assert OscarConfig(bits=4).bytes_per_token(8, 128) == pytest.approx(8 * 160.5)
    assert OscarConfig(bits=2, **PAPER_FORMAT).effective_bits(8, 128) == pytest.approx(3.0156, abs=1e-4)
    assert OscarConfig(bits=4).effective_bits(8, 128) == pytest.approx(5.0156, abs=1e-4)
    # No token scales stored without token scaling.
    assert OscarConfig.for_method("kivi", bits=2).effective_bits(8, 128) == pytest.approx(3.0)
    # G_K = 128 brings INT2 to ~84 B per head (spec: "6.1x"; exactly 84.5 B, 6.06x).
    assert OscarConfig(**{**PAPER_FORMAT, "k_group": 128}).bytes_per_token(8, 128) / 8 == pytest.approx(84.5)
    # The INT2 default (page-grid key ranges, G_K 16, G_V 64): 92.5 B per head and token.
    assert OscarConfig(bits=2).bytes_per_token(8, 128) == pytest.approx(8 * 92.5)


def test_methods():
    assert OscarConfig.for_method("kivi").method == "kivi"
    assert (OscarConfig.for_method("rotation-only").rotation, OscarConfig.for_method("rotation-only").token_scaling) == (True, False)
    assert OscarConfig.for_method("scaling-only").method == "scaling-only"
    with pytest.raises(OscarConfigError, match="unknown method"):
        OscarConfig.for_method("turbo")
