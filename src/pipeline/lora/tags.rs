//! `<lora:NAME:WEIGHT>` tags in a prompt, as upstream sd-cli reads them (`extract_and_remove_lora`
//! in examples/common/common.cpp): NAME runs to the first `:` (no `:` or `>` inside), WEIGHT to
//! the first `>`; each tag is cut out of the prompt with nothing else changed; a WEIGHT that
//! does not start with a number drops the tag; `|high_noise|NAME` names a LoRA for the
//! high-noise model of a MoE pair.

/// One tag found in a prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraTag {
    /// NAME as written (a file name under `--lora-model-dir`, with or without extension, or
    /// an absolute path), without the `|high_noise|` marker.
    pub name: String,
    /// The weight; `None` when WEIGHT does not start with a number (the tag is then ignored).
    pub weight: Option<f32>,
    /// Written `<lora:|high_noise|NAME:W>`.
    pub high_noise: bool,
}

const OPEN: &str = "<lora:";
const HIGH_NOISE: &str = "|high_noise|";

/// One tag starting at `at` (which starts with `<lora:`): its end (one past `>`) and parts.
fn tag_at(text: &str, at: usize) -> Option<(usize, &str, &str)> {
    let rest = &text[at + OPEN.len()..];
    let name_len = rest.find([':', '>'])?;
    if name_len == 0 || !rest[name_len..].starts_with(':') {
        return None;
    }
    let after = &rest[name_len + 1..];
    let weight_len = after.find('>')?;
    if weight_len == 0 {
        return None;
    }
    let end = at + OPEN.len() + name_len + 1 + weight_len + 1;
    Some((end, &rest[..name_len], &after[..weight_len]))
}

/// The longest leading number of `s` after leading whitespace, as C's `strtof` reads it.
fn leading_f32(s: &str) -> Option<f32> {
    let s = s.trim_start();
    let mut best = None;
    for (i, _) in s
        .char_indices()
        .skip(1)
        .chain(std::iter::once((s.len(), ' ')))
    {
        if let Ok(v) = s[..i].parse::<f32>() {
            best = Some(v);
        }
    }
    best
}

/// Every tag of `prompt`, and the prompt with the tags cut out.
pub fn extract(prompt: &str) -> (String, Vec<LoraTag>) {
    let mut out = String::with_capacity(prompt.len());
    let mut tags = Vec::new();
    let mut pos = 0;
    while let Some(found) = prompt[pos..].find(OPEN) {
        let at = pos + found;
        match tag_at(prompt, at) {
            Some((end, name, weight)) => {
                out.push_str(&prompt[pos..at]);
                let (name, high_noise) = match name.strip_prefix(HIGH_NOISE) {
                    Some(n) => (n, true),
                    None => (name, false),
                };
                tags.push(LoraTag {
                    name: name.to_string(),
                    weight: leading_f32(weight),
                    high_noise,
                });
                pos = end;
            }
            None => {
                // Not a tag here: keep `<` and look further.
                out.push_str(&prompt[pos..at + 1]);
                pos = at + 1;
            }
        }
    }
    out.push_str(&prompt[pos..]);
    (out, tags)
}

/// Whether `text` holds a tag (for the negative-prompt warning).
pub fn has_tag(text: &str) -> bool {
    !extract(text).1.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str, weight: f32) -> LoraTag {
        LoraTag {
            name: name.into(),
            weight: Some(weight),
            high_noise: false,
        }
    }

    #[test]
    fn tags_are_cut_and_everything_else_stays() {
        let (p, t) = extract("a lovely cat, <lora:marblesh:1>, <lora:b:-0.5> on a mat");
        assert_eq!(p, "a lovely cat, ,  on a mat");
        assert_eq!(t, vec![tag("marblesh", 1.0), tag("b", -0.5)]);
        let (p, t) = extract("a cat<lora:x:0.25>");
        assert_eq!((p.as_str(), t), ("a cat", vec![tag("x", 0.25)]));
    }

    #[test]
    fn weights_read_like_strtof() {
        let (_, t) = extract("<lora:a: 0.5abc><lora:b:1e-1><lora:c:abc><lora:d:.5>");
        let w: Vec<_> = t.iter().map(|t| t.weight).collect();
        assert_eq!(w, vec![Some(0.5), Some(0.1), None, Some(0.5)]);
    }

    #[test]
    fn not_a_tag_stays_literal() {
        for s in [
            "<lora:>",
            "<lora:a>",
            "<lora::1>",
            "<lora:a:>",
            "<lora:a:1",
            "<lora a:1>",
        ] {
            let (p, t) = extract(s);
            assert_eq!(p, s);
            assert!(t.is_empty(), "{s}");
        }
        // The weight runs to the first '>' and may hold ':' (then it is no number).
        let (p, t) = extract("x<lora:a:b:1>y");
        assert_eq!(p, "xy");
        assert_eq!(t[0].weight, None);
        // As the regex reads it: the name may hold '<'.
        let (p, t) = extract("<lora:<lora:a:1>");
        assert_eq!(p, "");
        assert_eq!((t[0].name.as_str(), t[0].weight), ("<lora", None));
    }

    #[test]
    fn high_noise_marker() {
        let (_, t) = extract("<lora:|high_noise|wan:0.7>");
        assert!(t[0].high_noise);
        assert_eq!(t[0].name, "wan");
    }
}
