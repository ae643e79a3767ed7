import hashlib

import pytest

from cadenza.edge.auth.api_keys import ApiKeyFileError, ApiKeys, bearer_token


def test_plain_and_hashed_keys(tmp_path):
    hashed = hashlib.sha256(b"s3cret-two").hexdigest()
    path = tmp_path / "keys"
    path.write_text(f"# team keys\ns3cret-one\n\nsha256:{hashed}\n")
    keys = ApiKeys.load(path)
    assert keys.check("s3cret-one") == hashlib.sha256(b"s3cret-one").hexdigest()[:12]
    assert keys.check("s3cret-two") == hashed[:12]
    for wrong in (None, "", "s3cret", "s3cret-one ", hashed):
        assert keys.check(wrong) is None


@pytest.mark.parametrize(
    "content", ["", "# only a comment\n", "sha256:abc\n", "sha256:" + "zz" * 32]
)
def test_bad_key_files(tmp_path, content):
    path = tmp_path / "keys"
    path.write_text(content)
    with pytest.raises(ApiKeyFileError):
        ApiKeys.load(path)


def test_unreadable_key_file(tmp_path):
    with pytest.raises(ApiKeyFileError, match="cannot read"):
        ApiKeys.load(tmp_path / "missing")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        (None, None),
    ],
)
def test_bearer_token(header, token):
    assert bearer_token(header) == token
