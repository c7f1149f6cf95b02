//! Prompt emphasis (A1111 syntax) as upstream sd-cli parses it for every family's prompt
//! (`parse_prompt_attention`, src/core/util.cpp).
//!
//! `(text)` multiplies the weight of `text` by 1.1, `[text]` divides it by 1.1, `(text:1.5)`
//! multiplies it by 1.5; brackets nest and multiply. `BREAK` ends a CLIP chunk. Consecutive
//! parts of equal weight are merged. All arithmetic is `f32`, in upstream's order, so weights
//! are bit-identical to upstream's.
//!
//! Upstream's rules, where they differ from A1111's `prompt_parser.py`:
//! - Only `\(` is unescaped. `\)`, `\[`, `\]`, `\\` and a lone `\` stay in the text verbatim,
//!   backslash included (A1111 drops the backslash of every escape).
//! - `:1.5)` with no open `(` is dropped (A1111 keeps it as text).
//! - The pattern is re-run on the rest of the prompt after every match, so the `\b` before
//!   `BREAK` always holds: `aBREAK b` is `a` + BREAK (A1111: text). After `BREAK` a word
//!   character must not follow (`BREAKfast` is text); word characters are ASCII `[A-Za-z0-9_]`.
//! - `BREAK` is the part `("BREAK", -1.0)`; brackets around it scale that weight, and two
//!   `BREAK`s with nothing between them merge into `("BREAKBREAK", -1.0)`: such parts are no
//!   longer a break for the CLIP conditioner and are tokenized as text ([`WeightedText::is_break`]).
//! - The weight is read with `std::stof`: the longest decimal prefix of `[+-]?[.0-9]+`
//!   (`1.2.3` is 1.2). Where `stof` throws (no digits, `(a:.)`; outside the `f32` range)
//!   upstream aborts; here it is an [`EmphasisError`].

/// A piece of prompt text and its attention weight.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightedText {
    pub text: String,
    pub weight: f32,
}

impl WeightedText {
    /// Whether the SD conditioner treats this part as a chunk break (upstream checks the text
    /// `BREAK` with weight exactly -1).
    pub fn is_break(&self) -> bool {
        self.text == "BREAK" && self.weight == -1.0
    }
}

/// A prompt weight upstream cannot read (its `std::stof` throws and sd-cli aborts).
#[derive(Debug, thiserror::Error)]
#[error("prompt weight \"{weight}\" in \"(...:{weight})\" is {reason}")]
pub struct EmphasisError {
    pub weight: String,
    pub reason: &'static str,
}

/// One match of upstream's attention pattern at the start of the remaining prompt.
enum Token<'t> {
    Open,
    OpenSquare,
    Close,
    CloseSquare,
    /// `:<number>)`, with the number's text.
    Weight(&'t str),
    /// `\(`: the only escape upstream unescapes.
    EscapedParen,
    Break,
    /// Everything else, pushed verbatim with weight 1.
    Text(&'t str),
}

/// 1.1 and 1/1.1 as upstream's `float` constants.
const ROUND_MULTIPLIER: f32 = 1.1;
const SQUARE_MULTIPLIER: f32 = 1.0 / 1.1;

/// Splits `prompt` into weighted parts (never empty: an empty prompt is one empty part).
pub fn parse_emphasis(prompt: &str) -> Result<Vec<WeightedText>, EmphasisError> {
    let mut res: Vec<WeightedText> = Vec::new();
    let mut round: Vec<usize> = Vec::new();
    let mut square: Vec<usize> = Vec::new();
    let multiply = |res: &mut Vec<WeightedText>, start: usize, m: f32| {
        for part in &mut res[start..] {
            part.weight *= m;
        }
    };
    let push = |res: &mut Vec<WeightedText>, text: &str, weight: f32| {
        res.push(WeightedText {
            text: text.to_string(),
            weight,
        })
    };

    let mut rest = prompt;
    while !rest.is_empty() {
        let (token, len) = next_token(rest);
        rest = &rest[len..];
        match token {
            Token::Open => round.push(res.len()),
            Token::OpenSquare => square.push(res.len()),
            Token::Weight(w) => {
                // Upstream reads the number only when a `(` is open; otherwise the match is dropped.
                if let Some(start) = round.pop() {
                    multiply(&mut res, start, stof(w)?);
                }
            }
            Token::Close => match round.pop() {
                Some(start) => multiply(&mut res, start, ROUND_MULTIPLIER),
                None => push(&mut res, ")", 1.0),
            },
            Token::CloseSquare => match square.pop() {
                Some(start) => multiply(&mut res, start, SQUARE_MULTIPLIER),
                None => push(&mut res, "]", 1.0),
            },
            Token::EscapedParen => push(&mut res, "(", 1.0),
            Token::Break => push(&mut res, "BREAK", -1.0),
            Token::Text(t) => push(&mut res, t, 1.0),
        }
    }
    // Unclosed brackets apply from their position to the end, bottom of the stack first.
    for &start in &round {
        multiply(&mut res, start, ROUND_MULTIPLIER);
    }
    for &start in &square {
        multiply(&mut res, start, SQUARE_MULTIPLIER);
    }
    if res.is_empty() {
        push(&mut res, "", 1.0);
    }
    let mut merged: Vec<WeightedText> = Vec::with_capacity(res.len());
    for part in res {
        match merged.last_mut() {
            Some(last) if last.weight == part.weight => last.text.push_str(&part.text),
            _ => merged.push(part),
        }
    }
    Ok(merged)
}

/// The first alternative of upstream's pattern that matches at the start of `rest`, and its byte
/// length. Every character starts some alternative, so nothing is ever skipped.
fn next_token(rest: &str) -> (Token<'_>, usize) {
    let b = rest.as_bytes();
    match b[0] {
        b'\\' => match b.get(1) {
            Some(b'(') => (Token::EscapedParen, 2),
            Some(b')' | b'[' | b']' | b'\\') => (Token::Text(&rest[..2]), 2),
            _ => (Token::Text(&rest[..1]), 1),
        },
        b'(' => (Token::Open, 1),
        b'[' => (Token::OpenSquare, 1),
        b')' => (Token::Close, 1),
        b']' => (Token::CloseSquare, 1),
        b':' => match weight_len(&b[1..]) {
            Some((number, len)) => (Token::Weight(&rest[1..1 + number]), 1 + len),
            None => (Token::Text(&rest[..1]), 1),
        },
        b'B' => {
            let word_follows = b.get(5).is_some_and(|&c| is_word_byte(c));
            if rest.starts_with("BREAK") && !word_follows {
                (Token::Break, 5)
            } else {
                (Token::Text(&rest[..1]), 1)
            }
        }
        _ => {
            let len = b
                .iter()
                .position(|c| matches!(c, b'\\' | b'(' | b')' | b'[' | b']' | b':' | b'B'))
                .unwrap_or(b.len());
            (Token::Text(&rest[..len]), len)
        }
    }
}

/// `[+-]?[.0-9]+\)` at the start of `b`: (length of the number, length including `)`).
fn weight_len(b: &[u8]) -> Option<(usize, usize)> {
    let sign = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let body = b[sign..]
        .iter()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .count();
    (body > 0 && b.get(sign + body) == Some(&b')')).then_some((sign + body, sign + body + 1))
}

/// ECMAScript `\w` in the C locale.
fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `std::stof` on `[+-]?[.0-9]+`: the longest prefix that is a decimal number; an error where
/// `stof` throws (no number, or `strtof` reports ERANGE: overflow, or a non-zero value that
/// underflows below the smallest normal `f32`).
fn stof(text: &str) -> Result<f32, EmphasisError> {
    let err = |reason| EmphasisError {
        weight: text.to_string(),
        reason,
    };
    let b = text.as_bytes();
    let sign = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let int = b[sign..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = sign + int;
    let mut digits = int;
    if b.get(end) == Some(&b'.') {
        let frac = b[end + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if int + frac > 0 {
            end += 1 + frac;
            digits += frac;
        }
    }
    if digits == 0 {
        return Err(err("not a number"));
    }
    let number = &text[..end];
    let value: f32 = number.parse().map_err(|_| err("not a number"))?;
    if value.is_infinite() {
        return Err(err("too large for a 32-bit float"));
    }
    let nonzero = number.bytes().any(|c| matches!(c, b'1'..=b'9'));
    if nonzero && value.abs() < f32::MIN_POSITIVE {
        return Err(err("too small for a 32-bit float"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(prompt: &str) -> Vec<(String, f32)> {
        parse_emphasis(prompt)
            .unwrap()
            .into_iter()
            .map(|p| (p.text, p.weight))
            .collect()
    }

    #[test]
    fn stof_prefixes() {
        assert_eq!(stof("1.2.3").unwrap(), 1.2);
        assert_eq!(stof("5..").unwrap(), 5.0);
        assert_eq!(stof("+.5").unwrap(), 0.5);
        assert_eq!(stof("-0").unwrap().to_bits(), (-0.0f32).to_bits());
        assert!(stof(".").is_err());
        assert!(stof("..5").is_err());
        assert!(stof("999999999999999999999999999999999999999").is_err());
        assert!(stof("0.000000000000000000000000000000000000001").is_err());
        assert_eq!(stof("0.000").unwrap(), 0.0);
    }

    #[test]
    fn upstream_doc_examples() {
        assert_eq!(parts("normal text"), [("normal text".into(), 1.0)]);
        assert_eq!(parts("(unbalanced"), [("unbalanced".into(), 1.1)]);
        assert_eq!(
            parts("(unnecessary)(parens)"),
            [("unnecessaryparens".into(), 1.1)]
        );
        // Upstream's comment promises "(literal]"; its code keeps the backslash of `\]`.
        assert_eq!(parts("\\(literal\\]"), [("(literal\\]".into(), 1.0)]);
    }

    #[test]
    fn bad_weight_is_an_error() {
        let e = parse_emphasis("(a:.)").unwrap_err();
        assert!(e.to_string().contains("\".\""), "{e}");
        // Without an open bracket upstream never reads the number.
        assert_eq!(parts("a:.)"), [("a".into(), 1.0)]);
    }
}
