"""Tensor name -> file name encoding (docs/interfaces.md, "Mount layout")."""

from __future__ import annotations

import hashlib

from ckptfs.util.names import NAME_MAX, assign_stems, capped_name, encode_name, file_name, file_stem, numbered_name


def test_plain_names_stay_as_they_are():
    assert encode_name("blk.0.attn_q.weight") == "blk.0.attn_q.weight"
    assert encode_name("..") == ".."
    assert encode_name("") == ""
    assert encode_name("ünïcødé") == "ünïcødé"


def test_special_characters_are_escaped():
    assert encode_name("a/b") == "a%2Fb"
    assert encode_name("100%") == "100%25"
    assert encode_name("x\0y") == "x%00y"
    assert encode_name("../../etc/passwd") == "..%2F..%2Fetc%2Fpasswd"


def test_invalid_utf8_bytes_are_escaped():
    name = b"bad\xff\xfe".decode("utf-8", "surrogateescape")
    assert encode_name(name) == "bad%FF%FE"


def test_encoding_is_reversible_and_distinct():
    names = ["a/b", "a%2Fb", "a%b", "a\0", "a%00", b"a\xff".decode("utf-8", "surrogateescape"), "a%FF"]
    encoded = [encode_name(n) for n in names]
    assert len(set(encoded)) == len(names)
    assert all("/" not in e and "\0" not in e for e in encoded)


def test_duplicates_are_numbered_without_colliding():
    assert assign_stems(["a", "a", "b", "a"]) == ["a", "a~2", "b", "a~3"]
    # a tensor literally named "a~2" keeps its name; the duplicate "a" moves on
    assert assign_stems(["a", "a", "a~2"]) == ["a", "a~3", "a~2"]
    assert assign_stems(["a~2", "a", "a"]) == ["a~2", "a", "a~3"]


def test_long_names_are_cut_and_hashed():
    name = "x" * 300
    stem = file_stem(name)
    assert len((stem + ".meta.json").encode()) <= NAME_MAX
    assert stem == "x" * 200 + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]
    other = file_stem("x" * 299 + "y")
    assert other != stem


def test_long_names_cut_on_character_and_escape_boundaries():
    name = "é" * 150  # 300 bytes
    stem = file_stem(name)
    prefix = stem.rsplit("~", 1)[0]
    assert prefix == "é" * 100
    escaped = "/" * 100  # encodes to 300 bytes of %2F
    prefix = file_stem(escaped).rsplit("~", 1)[0]
    assert prefix == "%2F" * 66


def test_name_at_the_limit_is_not_hashed():
    longest = "y" * (NAME_MAX - len(".meta.json"))
    assert file_stem(longest) == longest
    assert len((file_stem(longest, 2) + ".meta.json").encode()) <= NAME_MAX


def test_file_names_are_escaped_and_capped_with_their_extension():
    assert file_name("model.gguf") == "model.gguf"
    assert file_name(b"\xff\xfe.safetensors".decode("utf-8", "surrogateescape")) == "%FF%FE.safetensors"
    assert file_name("%FF%FE.safetensors") == "%25FF%25FE.safetensors"  # never the same name as the one above
    long = "é" * 150 + ".safetensors"  # 312 bytes
    cut = file_name(long)
    assert cut == "é" * 100 + "~" + hashlib.sha256(long.encode()).hexdigest()[:16] + ".safetensors"
    assert len(cut.encode()) <= NAME_MAX
    assert capped_name("100%.gguf") == "100%.gguf"  # a key that was not percent-decoded is only capped
    assert len(capped_name("k" * 300).encode()) == 200 + 1 + 16


def test_a_numbered_name_stays_within_the_limit():
    assert numbered_name("config.json", 2) == "config~2.json"
    assert numbered_name("README", 3) == "README~3"
    name = "c" * 250 + ".json"  # 255 bytes: "~2" would make it 257
    numbered = numbered_name(name, 2)
    assert numbered == "c" * 200 + "~" + hashlib.sha256(name.encode()).hexdigest()[:16] + "~2.json"
    assert numbered != numbered_name(name, 3)
