//! `--model-args`: typed per-family settings.
//!
//! Each family declares its keys as [`ModelArg`] constants (key, type, default, help) and lists
//! them in its registry entry; [`ModelArgs::parse`] validates a `--model-args` string against
//! every registered key once, and a family reads its values back typed with
//! [`ModelArgs::get`] (the value, or the key's default) or [`ModelArgs::given`] (only when the
//! user gave it).
//!
//! Upstream semantics (src/core/util.cpp `parse_key_value_args`, the model runners): items are
//! separated by `,` or `;`, keys and values are trimmed, an item without `=` is ignored with a
//! warning, and an invalid value is ignored with a warning, leaving the previous (or default)
//! value in force.

use std::fmt;

use crate::dtype::DType;

/// A parsed value of any key.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgValue {
    Bool(bool),
    Int(i64),
    Float(f32),
    CacheType(CacheType),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Bool(b) => write!(f, "{b}"),
            ArgValue::Int(i) => write!(f, "{i}"),
            ArgValue::Float(v) => write!(f, "{v}"),
            ArgValue::CacheType(t) => f.write_str(t.as_str()),
        }
    }
}

/// A type a model arg can have.
pub trait ArgType: Sized + Clone {
    fn parse(value: &str) -> Result<Self, String>;
    fn to_value(&self) -> ArgValue;
    fn from_value(value: &ArgValue) -> Option<Self>;
}

/// Upstream's strict bool: true/false, 1/0, yes/no, on/off, case-insensitive.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl ArgType for bool {
    fn parse(value: &str) -> Result<Self, String> {
        parse_bool(value).ok_or_else(|| "expected true/false, 1/0, yes/no or on/off".into())
    }
    fn to_value(&self) -> ArgValue {
        ArgValue::Bool(*self)
    }
    fn from_value(value: &ArgValue) -> Option<Self> {
        match value {
            ArgValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl ArgType for i64 {
    fn parse(value: &str) -> Result<Self, String> {
        // Upstream reads ints with std::stoi (32-bit).
        value
            .parse::<i32>()
            .map(i64::from)
            .map_err(|_| "expected an integer".to_string())
    }
    fn to_value(&self) -> ArgValue {
        ArgValue::Int(*self)
    }
    fn from_value(value: &ArgValue) -> Option<Self> {
        match value {
            ArgValue::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl ArgType for f32 {
    fn parse(value: &str) -> Result<Self, String> {
        match value.parse::<f32>() {
            Ok(f) if f.is_finite() => Ok(f),
            _ => Err("expected a finite number".into()),
        }
    }
    fn to_value(&self) -> ArgValue {
        ArgValue::Float(*self)
    }
    fn from_value(value: &ArgValue) -> Option<Self> {
        match value {
            ArgValue::Float(v) => Some(*v),
            _ => None,
        }
    }
}

/// Storage type of a K/V cache: `auto`, or a ggml type that can hold floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheType {
    /// The model decides (Qwen Image 2.1: f16 when flash attention is used, else f32).
    Auto,
    /// An explicit type. Whether it converts both ways and whether its block size divides the
    /// rows is checked by the model at load time.
    Type(DType),
}

impl CacheType {
    /// `"auto"` or the ggml type name.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheType::Auto => "auto",
            CacheType::Type(t) => t.name(),
        }
    }
}

/// Types that cannot store keys and values.
const NON_FLOAT_TYPES: [DType; 5] = [DType::I8, DType::I16, DType::I32, DType::I64, DType::F64];

impl ArgType for CacheType {
    /// `auto` or a ggml type name, spelled exactly as ggml does (like `--type`).
    fn parse(value: &str) -> Result<Self, String> {
        if value == "auto" {
            return Ok(CacheType::Auto);
        }
        match DType::ALL.iter().copied().find(|t| t.name() == value) {
            None => Err(format!(
                "unknown cache type (use auto or one of: {})",
                DType::ALL
                    .iter()
                    .filter(|t| !NON_FLOAT_TYPES.contains(t))
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(t) if NON_FLOAT_TYPES.contains(&t) => {
                Err(format!("type '{t}' cannot store keys and values"))
            }
            Some(t) => Ok(CacheType::Type(t)),
        }
    }
    fn to_value(&self) -> ArgValue {
        ArgValue::CacheType(*self)
    }
    fn from_value(value: &ArgValue) -> Option<Self> {
        match value {
            ArgValue::CacheType(t) => Some(*t),
            _ => None,
        }
    }
}

/// One `--model-args` key of type `T`.
pub struct ModelArg<T: 'static> {
    pub key: &'static str,
    pub default: T,
    pub help: &'static str,
    /// Extra validation of a parsed value (e.g. "must be > 0").
    pub check: fn(&T) -> Result<(), &'static str>,
}

impl<T: ArgType> ModelArg<T> {
    /// A key accepting every value of its type.
    pub const fn new(key: &'static str, default: T, help: &'static str) -> Self {
        Self {
            key,
            default,
            help,
            check: |_| Ok(()),
        }
    }

    /// A key whose values must also pass `check`.
    pub const fn checked(
        key: &'static str,
        default: T,
        help: &'static str,
        check: fn(&T) -> Result<(), &'static str>,
    ) -> Self {
        Self {
            key,
            default,
            help,
            check,
        }
    }
}

/// A key of any type, as the registry lists them.
pub trait ModelArgSpec: Sync {
    fn key(&self) -> &'static str;
    fn help(&self) -> &'static str;
    /// The default as text (for help and docs).
    fn default_text(&self) -> String;
    fn parse_value(&self, value: &str) -> Result<ArgValue, String>;
}

impl<T: ArgType + Sync> ModelArgSpec for ModelArg<T> {
    fn key(&self) -> &'static str {
        self.key
    }
    fn help(&self) -> &'static str {
        self.help
    }
    fn default_text(&self) -> String {
        self.default.to_value().to_string()
    }
    fn parse_value(&self, value: &str) -> Result<ArgValue, String> {
        let v = T::parse(value)?;
        (self.check)(&v).map_err(str::to_string)?;
        Ok(v.to_value())
    }
}

/// Splits a key=value list like upstream. Returns the pairs in order and warnings for
/// malformed items. `context` names the flag in the warnings (e.g. `"--model-args"`).
pub fn parse_key_value_list(raw: &str, context: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut pairs = Vec::new();
    let mut warnings = Vec::new();
    for token in raw.split([',', ';']) {
        let token = token.trim();
        if token.is_empty() {
            continue;
        }
        match token.split_once('=') {
            None => warnings.push(format!(
                "{context}: ignoring malformed item '{token}' (expected key=value)"
            )),
            Some((k, v)) => {
                let key = k.trim();
                if key.is_empty() {
                    warnings.push(format!(
                        "{context}: ignoring item '{token}' with an empty key"
                    ));
                } else {
                    pairs.push((key.to_string(), v.trim().to_string()));
                }
            }
        }
    }
    (pairs, warnings)
}

/// The `--model-args` of a run: the valid values given, by key (later items win).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelArgs {
    given: Vec<(&'static str, ArgValue)>,
}

impl ModelArgs {
    /// Parses `raw` against every key the registry knows (see [`ModelArgs::parse_with`]).
    pub fn parse(raw: &str) -> (ModelArgs, Vec<String>) {
        Self::parse_with(raw, &super::registry::model_arg_specs())
    }

    /// Parses `raw` against `specs`. Unknown keys and invalid values are skipped with a
    /// warning naming them; the previous value (or the default) stays in force.
    pub fn parse_with(raw: &str, specs: &[&'static dyn ModelArgSpec]) -> (ModelArgs, Vec<String>) {
        let (pairs, mut warnings) = parse_key_value_list(raw, "--model-args");
        let mut out = ModelArgs::default();
        for (key, value) in pairs {
            let Some(spec) = specs.iter().find(|s| s.key() == key) else {
                let known: Vec<&str> = specs.iter().map(|s| s.key()).collect();
                warnings.push(format!(
                    "--model-args: ignoring '{key}={value}': unknown key (known: {})",
                    known.join(", ")
                ));
                continue;
            };
            match spec.parse_value(&value) {
                Ok(v) => {
                    out.given.retain(|(k, _)| *k != spec.key());
                    out.given.push((spec.key(), v));
                }
                Err(why) => warnings.push(format!("--model-args: ignoring '{key}={value}': {why}")),
            }
        }
        (out, warnings)
    }

    /// The value of `arg` the user gave, if any.
    pub fn given<T: ArgType>(&self, arg: &ModelArg<T>) -> Option<T> {
        self.given
            .iter()
            .find(|(k, _)| *k == arg.key)
            .and_then(|(_, v)| T::from_value(v))
    }

    /// The value of `arg`: as given, else its default.
    pub fn get<T: ArgType>(&self, arg: &ModelArg<T>) -> T {
        self.given(arg).unwrap_or_else(|| arg.default.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.given.is_empty()
    }
}

impl fmt::Display for ModelArgs {
    /// The given values as `key=value,...` (for image metadata).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.given.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: ModelArg<bool> = ModelArg::new("flag", true, "a flag");
    const SIZE: ModelArg<i64> = ModelArg::checked("size", 64, "a size", |v| {
        if *v > 0 {
            Ok(())
        } else {
            Err("must be > 0")
        }
    });

    #[test]
    fn splits_on_comma_and_semicolon_and_trims() {
        let (p, w) = parse_key_value_list(" a = 1 ;b=2,, c=x=y ", "t");
        assert!(w.is_empty());
        assert_eq!(
            p,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
                ("c".into(), "x=y".into())
            ]
        );
    }

    #[test]
    fn bools_like_upstream() {
        for t in ["1", "TRUE", "yes", "On"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "false", "NO", "off"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("2"), None);
        assert_eq!(parse_bool(""), None);
    }

    #[test]
    fn typed_values_defaults_and_metadata_text() {
        let specs: [&'static dyn ModelArgSpec; 2] = [&FLAG, &SIZE];
        let (a, w) = ModelArgs::parse_with("size=3; flag=off, size=-1, nope=1", &specs);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(!a.get(&FLAG));
        assert_eq!(a.get(&SIZE), 3);
        assert_eq!(a.given(&SIZE), Some(3));
        assert_eq!(a.to_string(), "size=3,flag=false");
        let (d, _) = ModelArgs::parse_with("", &specs);
        assert!(d.get(&FLAG) && d.given(&FLAG).is_none());
        assert_eq!(SIZE.default_text(), "64");
    }
}
