"""Theia Cloud's names, byte for byte: a cluster the Java operator ran must be adoptable."""

import pytest

from warmpool.pool import naming

UID = "b8a1b2c3-0000-4000-8000-381261d79c23"


def test_spec_examples() -> None:
    assert naming.create_name("some-app-definition", UID, 1) == (
        "instance-1-some-app-definiti-381261d79c23"
    )
    assert naming.create_name("some-app-definition", UID, 1, "longidentifier") == (
        "instance-1-longidentif-some-app-de-381261d79c23"
    )
    assert naming.create_name_with_suffix("some-app-definition", UID, 1, "internal") == (
        "instance-1-some-app-defini-381261d79c23-internal"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("java-17-latest-1", "java-17-latest-1"),
        ("Upper_Case", "upper-case"),
        ("1starts-with-digit", "a1starts-with-digit"),
        ("ends-with-dash-", "ends-with-dashz"),
        ("x" * 70, "x" * 62),
        ("a.b@c", "a-b-c"),
        ("", ""),
    ],
)
def test_as_valid_name(text: str, expected: str) -> None:
    assert naming.as_valid_name(text) == expected


def test_cut_to_62_then_fix_the_last_character() -> None:
    # The cut happens before the last-character rule, as in Java.
    assert naming.as_valid_name("a" * 61 + "-b") == "a" * 61 + "z"


def test_ids_of_ten_and_more_and_long_names() -> None:
    long = "a-very-long-application-definition-name-indeed"
    name = naming.create_name(long, UID, 12)
    assert name == "instance-12-a-very-long-appli-381261d79c23"
    assert len(name) <= 62
    proxy = naming.create_name(long, UID, 12, "proxy")
    assert proxy == "instance-12-proxy-a-very-long-381261d79c23"
    suffixed = naming.create_name_with_suffix(long, UID, 123, "int")
    assert suffixed == "instance-123-a-very-long-appl-381261d79c23-int"
    assert len(suffixed) <= 62


def test_underscore_and_upper_case_in_spec_name() -> None:
    assert naming.create_name("My_App", UID, 3, "email") == "instance-3-email-my-app-381261d79c23"
    assert naming.app_selector("My_App", 3) == "my-app-3"


def test_blank_identifier_is_no_identifier() -> None:
    assert naming.create_name("app", UID, 1, "  ") == naming.create_name("app", UID, 1)


def test_suffix_must_not_be_blank() -> None:
    with pytest.raises(ValueError):
        naming.create_name_with_suffix("app", UID, 1, " ")


@pytest.mark.parametrize(
    ("user", "label"),
    [
        ("jane.doe@example.com", "jane_doe_at_example_com"),
        ("a+b@x.io", "a_b_at_x_io"),
        ("u" * 70 + "@x.io", "u" * 63),
    ],
)
def test_user_label(user: str, label: str) -> None:
    assert naming.user_label(user) == label


def test_user_label_never_ends_in_a_symbol() -> None:
    value = naming.user_label("u" * 61 + ".x@y.z")  # the cut lands on "_"
    assert value[-1].isalnum() and len(value) <= 63


def test_instance_id_from_name() -> None:
    assert naming.instance_id_from_name("instance-12-app-381261d79c23") == 12
    assert naming.instance_id_from_name("session-foo") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("short-name", "short-name"),
        ("s" * 62 + ".x" * 20, "s" * 62),  # cut at 63 lands on ".": trimmed
        ("-_name_-", "name"),
        ("a" * 253, "a" * 63),
    ],
)
def test_label_value_is_always_accepted_by_kubernetes(text: str, value: str) -> None:
    assert naming.label_value(text) == value
