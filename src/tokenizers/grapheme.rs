//! Extended grapheme cluster segmentation (UAX #29), as far as the precompiled normalizer needs it.
//!
//! HF `tokenizers` runs its `Precompiled` normalizer per grapheme cluster (not per character), and a
//! cluster's fate depends on its exact extent (see `precompiled.rs`), so we need the same
//! boundaries. All rules are implemented except GB9c (Indic conjunct clusters): those clusters
//! consist of 3-byte characters only, so every multi-character piece of them is at least 6 bytes,
//! and the normalizer treats clusters of 6 bytes or more character by character anyway.

use super::unicode_tables::{EXT_PICT_RANGES, GCB_RANGES};

/// Grapheme_Cluster_Break property values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gcb {
    Other,
    Cr,
    Lf,
    Control,
    Extend,
    Zwj,
    RegionalIndicator,
    Prepend,
    SpacingMark,
    L,
    V,
    T,
    Lv,
    Lvt,
}

const HANGUL_SYLLABLE_FIRST: u32 = 0xAC00;
const HANGUL_SYLLABLE_LAST: u32 = 0xD7A3;
const HANGUL_T_COUNT: u32 = 28;

fn gcb(c: char) -> Gcb {
    let cp = c as u32;
    if (HANGUL_SYLLABLE_FIRST..=HANGUL_SYLLABLE_LAST).contains(&cp) {
        // Syllables without a trailing consonant (LV) come every 28 code points.
        return if (cp - HANGUL_SYLLABLE_FIRST).is_multiple_of(HANGUL_T_COUNT) {
            Gcb::Lv
        } else {
            Gcb::Lvt
        };
    }
    match GCB_RANGES.binary_search_by(|&(lo, hi, _)| {
        if hi < cp {
            std::cmp::Ordering::Less
        } else if lo > cp {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(i) => GCB_RANGES[i].2,
        Err(_) => Gcb::Other,
    }
}

/// Whether `c` lies in one of the sorted, inclusive `ranges`.
pub(crate) fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let cp = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn is_ext_pict(c: char) -> bool {
    in_ranges(EXT_PICT_RANGES, c)
}

/// Splits `s` into extended grapheme clusters.
pub(crate) fn graphemes(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut chars = s.char_indices();
    let Some((_, first)) = chars.next() else {
        return out;
    };
    let mut start = 0usize;
    let mut prev = gcb(first);
    // GB11 state: the cluster so far ends in ExtPict Extend* (then `pict_zwj` once a ZWJ follows).
    let mut in_pict = is_ext_pict(first);
    let mut pict_zwj = false;
    // GB12/13 state: number of regional indicators immediately before the current position.
    let mut ri_run = usize::from(prev == Gcb::RegionalIndicator);
    for (pos, c) in chars {
        let cur = gcb(c);
        let pict = is_ext_pict(c);
        let join = match (prev, cur) {
            (Gcb::Cr, Gcb::Lf) => true,
            (Gcb::Cr | Gcb::Lf | Gcb::Control, _) | (_, Gcb::Cr | Gcb::Lf | Gcb::Control) => false,
            (Gcb::L, Gcb::L | Gcb::V | Gcb::Lv | Gcb::Lvt) => true,
            (Gcb::Lv | Gcb::V, Gcb::V | Gcb::T) => true,
            (Gcb::Lvt | Gcb::T, Gcb::T) => true,
            (_, Gcb::Extend | Gcb::Zwj | Gcb::SpacingMark) => true,
            (Gcb::Prepend, _) => true,
            (Gcb::Zwj, _) if pict && pict_zwj => true,
            (Gcb::RegionalIndicator, Gcb::RegionalIndicator) => ri_run % 2 == 1,
            _ => false,
        };
        if !join {
            out.push(&s[start..pos]);
            start = pos;
        }
        // Update GB11 state.
        if pict {
            in_pict = true;
            pict_zwj = false;
        } else if in_pict && cur == Gcb::Extend {
            pict_zwj = false;
        } else if in_pict && cur == Gcb::Zwj {
            pict_zwj = true;
            in_pict = false;
        } else {
            in_pict = false;
            pict_zwj = false;
        }
        ri_run = if cur == Gcb::RegionalIndicator {
            ri_run + 1
        } else {
            0
        };
        prev = cur;
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::graphemes;

    #[test]
    fn basic_clusters() {
        assert_eq!(graphemes(""), Vec::<&str>::new());
        assert_eq!(graphemes("ab"), vec!["a", "b"]);
        assert_eq!(graphemes("\r\nx"), vec!["\r\n", "x"]);
        assert_eq!(graphemes("e\u{301}x"), vec!["e\u{301}", "x"]);
        assert_eq!(graphemes("\n\u{301}"), vec!["\n", "\u{301}"]);
        assert_eq!(graphemes("가\u{11A8}"), vec!["가\u{11A8}"]);
        assert_eq!(
            graphemes("🇩🇪🇫"),
            vec!["🇩🇪", "🇫"],
            "regional indicators pair up"
        );
        assert_eq!(graphemes("👨\u{200D}👩"), vec!["👨\u{200D}👩"]);
        assert_eq!(graphemes("a\u{200D}👩"), vec!["a\u{200D}", "👩"]);
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::graphemes;

    /// Random strings segmented by the `regex` module's `\X` (tests/reference/tokenizer_fixtures.py).
    #[test]
    fn matches_regex_module() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tokenizers/graphemes.json"
        );
        let text = std::fs::read_to_string(path).expect("graphemes.json");
        let cases: serde_json::Value = serde_json::from_str(&text).expect("json");
        let cases = cases.as_array().expect("list");
        assert!(cases.len() >= 300);
        for c in cases {
            let s = c["text"].as_str().expect("text");
            let want: Vec<&str> = c["clusters"]
                .as_array()
                .expect("clusters")
                .iter()
                .map(|v| v.as_str().expect("str"))
                .collect();
            assert_eq!(graphemes(s), want, "{s:?}");
        }
    }
}
