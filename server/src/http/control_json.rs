//! The JSON bodies of the control endpoints (repository index, load and
//! unload, log and trace settings, shared-memory registration), read
//! without a JSON tree.
//!
//! A `serde_json::Value` tree costs about 37 times its text (`[0,0,...]`:
//! two bytes become a 32-byte `Value` plus vector growth), so a 16 MiB
//! body grew the server by 592 MiB and two 100 MiB bodies aborted it. Here
//! a body is at most [`MAX_CONTROL_BODY`] bytes, its top-level object is
//! kept as borrowed slices of the body (one [`Members`] entry per member,
//! at most [`MAX_MEMBERS`]), and each value is then parsed on its own into
//! the type its endpoint wants (a bool, an integer, a string, a list of
//! strings), never into a tree. A value of the wrong shape is refused by
//! its first character before anything is allocated for it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::Error;

/// The largest control body. The biggest legitimate one is a load's
/// `config` override, a model configuration as JSON text (kilobytes).
pub const MAX_CONTROL_BODY: usize = 1 << 20;

/// Members of one control object (a body, or a load's `parameters`).
pub const MAX_MEMBERS: usize = 64;

/// Strings in one list value (a trace setting's levels).
pub const MAX_LIST: usize = 64;

/// An object's members in the order given, each value as its raw text.
#[derive(Debug, Default)]
pub struct Members<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    /// The body's top-level object; an empty (or all-whitespace) body is `{}`.
    pub fn of_body(body: &'a [u8]) -> Result<Members<'a>, Error> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Members::default());
        }
        serde_json::from_slice(body)
            .map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))
    }

    /// A member's value as an object (a load's `parameters`).
    pub fn of_value(name: &str, value: &'a RawValue) -> Result<Members<'a>, Error> {
        if kind(value) != Kind::Object {
            return Err(Error::invalid(format!("'{name}' must be a JSON object")));
        }
        serde_json::from_str(value.get()).map_err(|e| Error::invalid(format!("'{name}': {e}")))
    }

    /// The value of the last member named `name`, as JSON gives it.
    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a JSON object of at most {MAX_MEMBERS} members")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if members.len() == MAX_MEMBERS {
                        return Err(de::Error::custom(format!("more than {MAX_MEMBERS} members")));
                    }
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// What a JSON value is, by its first character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

pub fn kind(value: &RawValue) -> Kind {
    match value.get().as_bytes().first() {
        Some(b'n') => Kind::Null,
        Some(b't' | b'f') => Kind::Bool,
        Some(b'"') => Kind::String,
        Some(b'[') => Kind::Array,
        Some(b'{') => Kind::Object,
        _ => Kind::Number,
    }
}

pub fn as_bool(value: &RawValue) -> Option<bool> {
    (kind(value) == Kind::Bool).then(|| value.get() == "true")
}

pub fn as_string(value: &RawValue) -> Option<String> {
    (kind(value) == Kind::String)
        .then(|| serde_json::from_str(value.get()).ok())
        .flatten()
}

pub fn as_i64(value: &RawValue) -> Option<i64> {
    (kind(value) == Kind::Number)
        .then(|| serde_json::from_str(value.get()).ok())
        .flatten()
}

pub fn as_u64(value: &RawValue) -> Option<u64> {
    (kind(value) == Kind::Number)
        .then(|| serde_json::from_str(value.get()).ok())
        .flatten()
}

/// A list of at most [`MAX_LIST`] strings; `None` for anything else.
pub fn as_strings(value: &RawValue) -> Option<Vec<String>> {
    if kind(value) != Kind::Array {
        return None;
    }
    let items: Vec<&RawValue> = serde_json::from_str(value.get()).ok()?;
    if items.len() > MAX_LIST {
        return None;
    }
    items.into_iter().map(as_string).collect()
}

/// A value shown in an error: its text, cut short.
pub fn shown(value: &RawValue) -> String {
    let text = value.get();
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_its_members_as_borrowed_text() {
        let body = br#"{"ready": true, "parameters": {"config": "{}", "x": [1, 2]}}"#;
        let members = Members::of_body(body).unwrap();
        assert_eq!(as_bool(members.get("ready").unwrap()), Some(true));
        let parameters = Members::of_value("parameters", members.get("parameters").unwrap()).unwrap();
        assert_eq!(as_string(parameters.get("config").unwrap()).as_deref(), Some("{}"));
        assert_eq!(kind(parameters.get("x").unwrap()), Kind::Array);
        assert!(Members::of_body(b"  \n").unwrap().0.is_empty());
    }

    #[test]
    fn anything_but_a_small_object_is_refused_before_it_is_built() {
        let array = format!("[{}0]", "0,".repeat(100_000));
        assert!(Members::of_body(array.as_bytes()).is_err());
        let wide: String = (0..=MAX_MEMBERS)
            .map(|i| format!("\"k{i}\":0"))
            .collect::<Vec<_>>()
            .join(",");
        let error = Members::of_body(format!("{{{wide}}}").as_bytes()).unwrap_err();
        assert!(error.message().contains("more than 64 members"), "{error:?}");
        let members = Members::of_body(br#"{"p": [1]}"#).unwrap();
        assert!(Members::of_value("p", members.get("p").unwrap()).is_err());
    }

    #[test]
    fn values_are_taken_only_in_the_shape_asked_for() {
        let members = Members::of_body(br#"{"b": 1, "s": "a\n", "n": -3, "l": ["a", "b"], "m": ["a", 1]}"#).unwrap();
        assert_eq!(as_bool(members.get("b").unwrap()), None);
        assert_eq!(as_string(members.get("s").unwrap()).as_deref(), Some("a\n"));
        assert_eq!(as_i64(members.get("n").unwrap()), Some(-3));
        assert_eq!(as_u64(members.get("n").unwrap()), None);
        assert_eq!(
            as_strings(members.get("l").unwrap()),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(as_strings(members.get("m").unwrap()), None);
        let long = format!("[{}\"\"]", "\"\",".repeat(MAX_LIST));
        let body = format!("{{\"l\": {long}}}");
        let members = Members::of_body(body.as_bytes()).unwrap();
        assert_eq!(as_strings(members.get("l").unwrap()), None);
    }
}
