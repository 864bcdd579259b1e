//! Request decoding: every body a route receives is read here, and only here, into
//! the types the routes judge — AdmissionReviews ([`review`]), the scheduler
//! extender's filter and bind requests ([`extender`], [`binding`]), Volcano's
//! predicate request ([`volcano`]) and the pods and ResourceClaims they carry
//! ([`pod`], [`claim`]) — together with the answers written back in the same
//! dialects. A body that cannot be read is refused with one [`DecodeError`], whose
//! text is the 400 a caller reads and whose kind is the metric label. What a route
//! does with a decoded request is not here (`admission`, `extender`).
//!
//! Every body that reaches a route is untrusted (docs/security.md). Decoding into full
//! Kubernetes types can cost hundreds of times the body's size (`[{},{},...]` of
//! `Volume`s is three bytes per element and kilobytes per decoded struct), so bodies
//! are decoded under three rules:
//! - a cheap scan counts the JSON values of a part before any of it is decoded, and
//!   refuses a part with more than its budget ([`check_budget`]);
//! - pods are decoded into the few fields gpu-admission reads ([`pod::decode`]), never
//!   into the whole `Pod` schema;
//! - lists (node names, node objects) have a maximum length, checked while decoding.
//!
//! With those, the memory a request takes is a small multiple of its body.

pub(crate) mod binding;
pub(crate) mod claim;
mod error;
pub(crate) mod expect;
pub mod extender;
pub(crate) mod filter_result;
pub mod pod;
pub mod review;
pub mod volcano;

pub(crate) use error::{DecodeError, Fault};

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;
use std::marker::PhantomData;

/// Most JSON values (objects, arrays, scalars) one pod may carry. A real pod of the
/// apiserver's maximum size has far fewer; each value costs at most ~150 bytes once
/// decoded, so this caps a pod at ~15 MiB of memory whatever its body.
const MAX_POD_VALUES: usize = 100_000;

/// Most nodes or node names one extender request may carry (Kubernetes supports
/// clusters of 5,000 nodes).
const MAX_NODES: usize = 15_000;

/// Refuse `raw` when it holds more than `max` JSON values. An upper bound is enough:
/// every value but the first follows a `[`, `{`, `,` or `:` outside a string, and a
/// `:` always follows a key that was counted after its `{` or `,`.
fn check_budget(what: &str, raw: &[u8], max: usize) -> Result<(), DecodeError> {
    if !within_budget(raw, max) {
        return Err(DecodeError::OverBudget {
            what: what.to_string(),
            max,
        });
    }
    Ok(())
}

/// Whether `raw` holds at most `max` JSON values, as [`check_budget`] counts them. A
/// part of `raw` that is a JSON value holds at most as many as `raw`.
fn within_budget(raw: &[u8], max: usize) -> bool {
    // Each value counted after the first is one byte of `raw`, so a short `raw` is
    // within any budget it is shorter than, and the number of those bytes anywhere
    // (inside strings too: a count the compiler vectorizes) bounds the count from
    // above. Only a body that has more of them than `max` is scanned value by value.
    if raw.len() < max {
        return true;
    }
    let structural = raw
        .iter()
        .map(|&b| usize::from(b == b'[') + usize::from(b == b'{') + usize::from(b == b','))
        .sum::<usize>();
    structural < max || count_values(raw, max) <= max
}

/// The values [`check_budget`] counts in `raw`, stopping once past `max`.
fn count_values(raw: &[u8], max: usize) -> usize {
    let mut values = 1usize;
    let (mut in_string, mut escaped) = (false, false);
    for &byte in raw {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' | b',' => {
                values += 1;
                if values > max {
                    return values;
                }
            }
            _ => {}
        }
    }
    values
}

/// Decode a part of a request from its raw text; the error names the part and, when
/// the content is wrong, the path inside it. Decodes untracked first (tracking the
/// path costs a third of decoding 5,000 node names); only a part that fails is decoded
/// again with its path, for the message.
fn decode_raw<'a, T: Deserialize<'a>>(what: &str, raw: &'a str) -> Result<T, DecodeError> {
    serde_json::from_str(raw).or_else(|_| {
        let mut deserializer = serde_json::Deserializer::from_str(raw);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| located(what, e))
    })
}

fn located(what: &str, e: serde_path_to_error::Error<serde_json::Error>) -> DecodeError {
    DecodeError::Content {
        what: what.to_string(),
        path: e.path().to_string(),
        fault: Fault::of(e.inner()),
        detail: e.inner().to_string(),
    }
}

/// A JSON array of at most `MAX` elements, refused while decoding (before the rest of
/// an oversized array is read into memory).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bounded<T, const MAX: usize>(Vec<T>);

impl<'de, T: serde::Deserialize<'de>, const MAX: usize> serde::Deserialize<'de>
    for Bounded<T, MAX>
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Elements<T, const MAX: usize>(PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>, const MAX: usize> Visitor<'de> for Elements<T, MAX> {
            type Value = Bounded<T, MAX>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an array of at most {MAX} elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element()? {
                    if items.len() == MAX {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX} elements"
                        )));
                    }
                    items.push(item);
                }
                Ok(Bounded(items))
            }
        }
        deserializer.deserialize_seq(Elements::<T, MAX>(PhantomData))
    }
}

/// The values of `keys` in the JSON object `raw`, matched in any letter case (as Go's
/// decoder matches struct fields); `null` counts as absent. Other keys are skipped
/// without being stored, so an object of a million junk keys costs nothing.
fn object_parts<'a, const N: usize>(
    what: &str,
    raw: &'a str,
    keys: [&'static str; N],
) -> Result<[Option<&'a RawValue>; N], DecodeError> {
    let mut deserializer = serde_json::Deserializer::from_str(raw);
    let parts = deserializer
        .deserialize_map(Parts { keys: &keys })
        .and_then(|parts| deserializer.end().map(|()| parts))
        .map_err(|e| {
            if e.is_data() {
                DecodeError::NotAnObject {
                    what: what.to_string(),
                    expected: "a JSON object",
                }
            } else {
                DecodeError::syntax(what, &e)
            }
        })?;
    Ok(parts)
}

/// `raw` as text: JSON bodies must be UTF-8.
fn text(raw: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(raw).map_err(|e| DecodeError::Malformed {
        what: "request".into(),
        detail: format!("not UTF-8 ({e})"),
    })
}

struct Parts<'k, const N: usize> {
    keys: &'k [&'static str; N],
}

impl<'de, const N: usize> Visitor<'de> for Parts<'_, N> {
    type Value = [Option<&'de RawValue>; N];
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = [None; N];
        while let Some(index) = map.next_key_seed(KeyIndex { keys: self.keys })? {
            match index {
                Some(i) => {
                    let value: &'de RawValue = map.next_value()?;
                    found[i] = (value.get() != "null").then_some(value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// Which of `keys` an object key is, matched in any letter case ([`object_parts`]'s
/// rule), for other visitors of request objects.
struct KeyIndex<'k, const N: usize> {
    keys: &'k [&'static str; N],
}

impl<'de, const N: usize> DeserializeSeed<'de> for KeyIndex<'_, N> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for KeyIndex<'_, N> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.keys.iter().position(|k| k.eq_ignore_ascii_case(key)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn budget_counts_values_outside_strings_only() {
        assert!(check_budget("x", br#"{"a": [1, 2, 3]}"#, 5).is_ok());
        let err = check_budget("Pod", br#"{"a": [1, 2, 3, 4, 5]}"#, 5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Pod has more than 5 JSON values; refusing to decode it"
        );
        assert_eq!(err.kind(), "over_limit");
        // Brackets and commas inside strings (escaped quotes too) are text, not values.
        assert!(check_budget("x", br#"{"a": "[[[,,,{{{\"[[[,,,"}"#, 2).is_ok());
        let million_empty_objects = format!("[{}]", vec!["{}"; 1_000_000].join(","));
        assert!(check_budget("x", million_empty_objects.as_bytes(), MAX_POD_VALUES).is_err());
    }

    /// Every value counted, with no shortcut: what `check_budget` must agree with.
    fn reference_within_budget(raw: &[u8], max: usize) -> bool {
        count_values(raw, max) <= max
    }

    #[test]
    fn budget_shortcuts_agree_with_counting_every_value() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let alphabet = b"\"\\[{,:}] a1";
        for _ in 0..20_000 {
            let length = rng.random_range(0..40);
            let raw: Vec<u8> = (0..length)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let max = rng.random_range(1..12);
            assert_eq!(
                check_budget("x", &raw, max).is_ok(),
                reference_within_budget(&raw, max),
                "{:?} with a budget of {max}",
                String::from_utf8_lossy(&raw)
            );
        }
    }

    #[test]
    fn object_parts_match_any_case_skip_the_rest_and_treat_null_as_absent() {
        let [pod, names, nodes] = object_parts(
            "request",
            r#"{"pod": {"a": 1}, "junk": [1, {"x": 2}], "NODENAMES": ["n"], "Nodes": null}"#,
            ["Pod", "NodeNames", "Nodes"],
        )
        .unwrap();
        assert_eq!(pod.unwrap().get(), r#"{"a": 1}"#);
        assert_eq!(names.unwrap().get(), r#"["n"]"#);
        assert!(nodes.is_none());
        let not_object = object_parts("request", "[1]", ["Pod"]).unwrap_err();
        assert_eq!(not_object.to_string(), "request must be a JSON object");
        assert_eq!(not_object.kind(), "wrong_type");
        let cut_short = object_parts("request", "{", ["Pod"]).unwrap_err();
        assert!(
            cut_short
                .to_string()
                .starts_with("request is not valid JSON")
        );
        assert_eq!(cut_short.kind(), "malformed_json");
    }

    /// The kind of a failure is read from serde_json's error; its text is kept whole.
    #[test]
    fn decode_failures_are_counted_by_kind() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let err = decode_raw::<serde_json::Value>("part", &deep).unwrap_err();
        assert_eq!(err.kind(), "too_deep");
        assert!(
            err.to_string().starts_with("part at [0][0]")
                && err.to_string().contains(": recursion limit exceeded"),
            "{err}"
        );
        let err = decode_raw::<Bounded<u8, 1>>("list", "[1, 2]").unwrap_err();
        assert_eq!(err.kind(), "over_limit");
        assert!(
            err.to_string().starts_with("list: more than 1 elements"),
            "{err}"
        );
        let err = decode_raw::<Vec<u8>>("list", "[1, 300]").unwrap_err();
        assert_eq!(err.kind(), "invalid_value");
        assert!(
            err.to_string().starts_with("list at [1]: invalid value"),
            "{err}"
        );
        let err = decode_raw::<Vec<u8>>("list", "[1, 2").unwrap_err();
        assert_eq!(err.kind(), "malformed_json");
        let err = text(b"\xff").unwrap_err();
        assert_eq!(err.kind(), "malformed_json");
        assert!(
            err.to_string()
                .starts_with("request is not valid JSON: not UTF-8")
        );
    }

    #[test]
    fn bounded_arrays_refuse_one_element_too_many() {
        let ok: Bounded<u8, 3> = serde_json::from_str("[1, 2, 3]").unwrap();
        assert_eq!(ok.0, [1, 2, 3]);
        let err = serde_json::from_str::<Bounded<u8, 3>>("[1, 2, 3, 4]").unwrap_err();
        assert!(err.to_string().contains("more than 3 elements"), "{err}");
    }
}
