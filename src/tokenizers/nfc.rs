//! Unicode NFC (canonical decomposition, canonical ordering, canonical composition), as HF
//! `tokenizers`' `NFC` normalizer applies it before byte-level BPE.

use super::nfc_tables::{CCC, COMPOSE, DECOMP};

const S_BASE: u32 = 0xAC00;
const L_BASE: u32 = 0x1100;
const V_BASE: u32 = 0x1161;
const T_BASE: u32 = 0x11A7;
const L_COUNT: u32 = 19;
const V_COUNT: u32 = 21;
const T_COUNT: u32 = 28;
const N_COUNT: u32 = V_COUNT * T_COUNT;
const S_COUNT: u32 = L_COUNT * N_COUNT;

/// Below U+0300 every character is a starter already in NFC, so such text is unchanged.
const FIRST_AFFECTED: u32 = 0x300;

fn ccc(c: u32) -> u8 {
    if c < FIRST_AFFECTED {
        return 0;
    }
    match CCC.binary_search_by(|&(lo, hi, _)| {
        if hi < c {
            std::cmp::Ordering::Less
        } else if lo > c {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(i) => CCC[i].2,
        Err(_) => 0,
    }
}

fn decompose(c: u32, out: &mut Vec<u32>) {
    if (S_BASE..S_BASE + S_COUNT).contains(&c) {
        let s = c - S_BASE;
        out.push(L_BASE + s / N_COUNT);
        out.push(V_BASE + (s % N_COUNT) / T_COUNT);
        let t = s % T_COUNT;
        if t != 0 {
            out.push(T_BASE + t);
        }
        return;
    }
    match DECOMP.binary_search_by_key(&c, |&(k, _)| k) {
        Ok(i) => out.extend_from_slice(DECOMP[i].1),
        Err(_) => out.push(c),
    }
}

fn compose_pair(a: u32, b: u32) -> Option<u32> {
    // Hangul L+V → LV, LV+T → LVT.
    if (L_BASE..L_BASE + L_COUNT).contains(&a) && (V_BASE..V_BASE + V_COUNT).contains(&b) {
        return Some(S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT);
    }
    if (S_BASE..S_BASE + S_COUNT).contains(&a)
        && (a - S_BASE).is_multiple_of(T_COUNT)
        && (T_BASE + 1..T_BASE + T_COUNT).contains(&b)
    {
        return Some(a + (b - T_BASE));
    }
    COMPOSE
        .binary_search_by_key(&(a, b), |&(x, y, _)| (x, y))
        .ok()
        .map(|i| COMPOSE[i].2)
}

/// The NFC form of `text`.
pub fn nfc(text: &str) -> String {
    if text.chars().all(|c| (c as u32) < FIRST_AFFECTED) {
        return text.to_string();
    }
    // Decompose.
    let mut cps = Vec::with_capacity(text.len());
    for c in text.chars() {
        decompose(c as u32, &mut cps);
    }
    // Canonical ordering: stable sort of each run of non-starters by class.
    let mut i = 0;
    while i < cps.len() {
        if ccc(cps[i]) == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < cps.len() && ccc(cps[i]) != 0 {
            i += 1;
        }
        cps[start..i].sort_by_key(|&c| ccc(c));
    }
    // Compose: each character joins the last starter unless blocked by an intervening
    // character of equal or higher class (or any starter).
    let mut out: Vec<u32> = Vec::with_capacity(cps.len());
    let mut starter: Option<usize> = None;
    let mut last_ccc: i16 = -1;
    for &c in &cps {
        let cc = ccc(c);
        if let Some(si) = starter {
            let blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= i16::from(cc));
            // last_ccc == -1 means c directly follows the starter.
            if !blocked {
                if let Some(comp) = compose_pair(out[si], c) {
                    out[si] = comp;
                    continue;
                }
            }
        }
        if cc == 0 {
            starter = Some(out.len());
            last_ccc = -1;
        } else {
            last_ccc = i16::from(cc);
        }
        out.push(c);
    }
    out.into_iter().filter_map(char::from_u32).collect()
}

#[cfg(test)]
mod tests {
    use super::nfc;

    #[test]
    fn composes_and_orders() {
        assert_eq!(nfc("cafe\u{301}"), "caf\u{e9}");
        assert_eq!(nfc("\u{212b}"), "\u{c5}");
        assert_eq!(nfc("\u{1100}\u{1161}\u{11a8}"), "\u{ac01}");
        // q + dot below + dot above stays decomposed but ordered; e + circumflex + dot below → ệ.
        assert_eq!(nfc("q\u{307}\u{323}"), "q\u{323}\u{307}");
        assert_eq!(nfc("e\u{302}\u{323}"), "\u{1ec7}");
        assert_eq!(nfc("plain ascii"), "plain ascii");
    }
}
