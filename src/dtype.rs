//! Tensor element types: the one table of ggml's types, shared by the model-file readers
//! (which never touch ggml) and the ggml layer.
//!
//! [`DType`]'s discriminant is ggml's `enum ggml_type` id (as stored in GGUF files), and its
//! block size / bytes per block follow ggml's `type_traits` table (`ggml/src/ggml.c`, block
//! structs in `ggml/src/ggml-common.h`). The ggml layer checks this table against the ggml it
//! links (`ggml::types` tests), so the two cannot drift apart.

use std::fmt;
use std::str::FromStr;

/// A ggml tensor type (ids as in ggml's `enum ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    // 4 and 5 (Q4_2, Q4_3) were removed from ggml.
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    // 31..=33 (Q4_0_4_4 ...) and 36..=38 (IQ4_NL_4_4 ...) are no longer valid in files.
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// ggml's super-block size for the K-quants and i-quants (`QK_K`).
const QK_K: usize = 256;

impl DType {
    /// Every type, in id order.
    pub const ALL: [DType; 35] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::IQ1_M,
        DType::BF16,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];

    /// The ggml type id (as stored in GGUF tensor infos).
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The type with ggml id `id`, or `None` for ids that are unknown or were removed.
    pub fn from_id(id: u32) -> Option<DType> {
        use DType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            40 => NVFP4,
            41 => Q1_0,
            42 => Q2_0,
            _ => return None,
        })
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        use DType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_0 | NVFP4 => 64,
            Q1_0 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_xxx)` in ggml-common.h; element size for plain types).
    pub fn type_size(self) -> usize {
        use DType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            F64 => 8,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 => 8,
            Q4_0 => 18,    // f16 d + 16 nibble bytes
            Q4_1 => 20,    // f16 d, m + 16
            Q5_0 => 22,    // f16 d + u32 high bits + 16
            Q5_1 => 24,    // f16 d, m + u32 + 16
            Q8_0 => 34,    // f16 d + 32
            Q8_1 => 36,    // f16 d, s + 32 (older Python gguf still says 40)
            Q2_K => 84,    // 2 f16 + 16 scales + 64 quants
            Q3_K => 110,   // f16 + 64 + 32 + 12
            Q4_K => 144,   // 2 f16 + 12 + 128
            Q5_K => 176,   // 2 f16 + 12 + 128 + 32
            Q6_K => 210,   // f16 + 16 + 192
            Q8_K => 292,   // f32 + 256 + 16 i16
            IQ2_XXS => 66, // f16 + 32 u16
            IQ2_XS => 74,  // f16 + 32 u16 + 8
            IQ3_XXS => 98, // f16 + 96
            IQ1_S => 50,   // f16 + 32 + 16
            IQ4_NL => 18,  // f16 + 16
            IQ3_S => 110,  // f16 + 13*8 + 4
            IQ2_S => 82,   // f16 + 64 + 16
            IQ4_XS => 136, // f16 + u16 + 4 + 128
            IQ1_M => 56,   // 32 + 16 + 8
            TQ1_0 => 54,   // f16 + 4 + 48
            TQ2_0 => 66,   // f16 + 64
            MXFP4 => 17,   // e8m0 scale + 16
            NVFP4 => 36,   // 4 e4m3 scales + 32
            Q1_0 => 18,    // f16 + 16
            Q2_0 => 18,    // f16 + 16
        }
    }

    /// True for block-quantized types (block size > 1).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of one row of `ne0` elements, or `None` when `ne0` is not a whole number of
    /// blocks (or the size overflows).
    pub fn row_bytes(self, ne0: usize) -> Option<usize> {
        let block = self.block_size();
        if !ne0.is_multiple_of(block) {
            return None;
        }
        (ne0 / block).checked_mul(self.type_size())
    }

    /// Bytes of a tensor with ggml shape `ne` (innermost first); `None` when the row size is not a
    /// whole number of blocks or the size overflows.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        let (first, rest) = match ne.split_first() {
            Some(split) => split,
            None => return Some(self.type_size() as u64),
        };
        let first = usize::try_from(*first).ok()?;
        let mut total = self.row_bytes(first)? as u64;
        for &n in rest {
            total = total.checked_mul(n)?;
        }
        Some(total)
    }

    /// ggml's type name, also the spelling sd-cli's `--type` accepts (`q4_K`, `iq2_xxs`, ...).
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ3_XXS => "iq3_xxs",
            IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl",
            IQ3_S => "iq3_s",
            IQ2_S => "iq2_s",
            IQ4_XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1_M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
            NVFP4 => "nvfp4",
            Q1_0 => "q1_0",
            Q2_0 => "q2_0",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl DType {
    /// The type named `name` (ggml's spelling, any case: `q4_k`, `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<DType> {
        let wanted = name.trim();
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(wanted))
    }
}

/// A type name no [`DType`] has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tensor type '{value}' (expected one of: {expected})")]
pub struct UnknownDType {
    pub value: String,
    pub expected: String,
}

impl FromStr for DType {
    type Err = UnknownDType;

    /// Parses ggml type names case-insensitively (`q4_k`, `Q4_K`, `bf16`...).
    fn from_str(s: &str) -> Result<DType, UnknownDType> {
        DType::from_name(s).ok_or_else(|| UnknownDType {
            value: s.to_string(),
            expected: DType::ALL.map(|t| t.name()).join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_ids_are_unique_and_round_trip() {
        let mut ids: Vec<u32> = DType::ALL.iter().map(|t| t.id()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 35);
        for id in 0..64 {
            if let Some(t) = DType::from_id(id) {
                assert_eq!(t.id(), id);
                assert_eq!(t.name().parse::<DType>().unwrap(), t);
                assert_eq!(t.name().to_uppercase().parse::<DType>().unwrap(), t);
            }
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43] {
            assert!(DType::from_id(removed).is_none());
        }
        assert!("q9_9"
            .parse::<DType>()
            .unwrap_err()
            .to_string()
            .contains("q8_0"));
    }

    #[test]
    fn row_bytes_checks_blocks() {
        assert_eq!(DType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(DType::Q4_K.row_bytes(100), None);
        assert_eq!(DType::F16.row_bytes(3), Some(6));
        assert_eq!(DType::F32.nbytes(&[u64::MAX, 2]), None);
    }
}
