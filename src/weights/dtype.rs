//! Tensor element types.
//!
//! [`DType`] is a ggml tensor type: its discriminant is ggml's `enum ggml_type` id (as stored in
//! GGUF files), and its block size / bytes per block follow ggml's `type_traits` table
//! (`ggml/src/ggml.c`, block structs in `ggml/src/ggml-common.h`, checked against the ggml shipped
//! in llama-cpp-sys-2 0.1.161). [`SourceDType`] is the element type as stored in a file, which for
//! safetensors may be a type ggml cannot hold directly (F8, I64, F64...); it knows which `DType`
//! the tensor becomes on load and how to convert the bytes.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use super::error::{Result, WeightsError};

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
const QK_K: u32 = 256;

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
    pub fn block_size(self) -> u32 {
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
    pub fn type_size(self) -> u32 {
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

    /// Bytes of one row of `ne0` elements; an error when `ne0` is not a whole number of blocks.
    pub fn row_bytes(self, ne0: u64) -> Result<u64> {
        let block = u64::from(self.block_size());
        if !ne0.is_multiple_of(block) {
            return Err(WeightsError::RowSize {
                dtype: self.name(),
                ne0,
                block,
            });
        }
        (ne0 / block)
            .checked_mul(u64::from(self.type_size()))
            .ok_or(WeightsError::RowSize {
                dtype: self.name(),
                ne0,
                block,
            })
    }

    /// Bytes of a tensor with ggml shape `ne` (innermost first); `None` when the row size is not a
    /// whole number of blocks or the size overflows.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        let (first, rest) = match ne.split_first() {
            Some(split) => split,
            None => return Some(u64::from(self.type_size())),
        };
        let mut total = self.row_bytes(*first).ok()?;
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

impl FromStr for DType {
    type Err = WeightsError;

    /// Parses ggml type names case-insensitively (`q4_k`, `Q4_K`, `bf16`...).
    fn from_str(s: &str) -> Result<DType> {
        let wanted = s.trim();
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                let names: Vec<&str> = DType::ALL.iter().map(|t| t.name()).collect();
                WeightsError::BadTypeName {
                    value: s.to_string(),
                    expected: names.join(", "),
                }
            })
    }
}

/// The element type a tensor has *in the file*.
///
/// `Ggml(t)` means the bytes are already laid out as ggml type `t` and load unchanged (every
/// GGUF tensor, and safetensors F16/BF16/F32/I8/I16/I32). The other variants are safetensors
/// types that ggml cannot take as they are; [`SourceDType::load_dtype`] says what they become.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceDType {
    Ggml(DType),
    /// safetensors F64: converted to F32 on load (as stable-diffusion.cpp does).
    F64,
    /// safetensors I64: converted to I32 on load (values saturate to the i32 range).
    I64,
    /// safetensors F8_E4M3 (fn variant: no infinities, 0x7f/0xff are NaN): converted to F16.
    F8E4M3,
    /// safetensors F8_E5M2: converted to F16 (exactly: it is the top byte of an f16).
    F8E5M2,
    /// safetensors F8_E8M0 (power-of-two scales): not loaded.
    F8E8M0,
    /// safetensors U8: not loaded (stable-diffusion.cpp skips U8 tensors, e.g. `.comfy_quant`).
    U8,
    /// safetensors BOOL: not loaded.
    Bool,
    /// safetensors U16 / U32 / U64: not loaded.
    U16,
    U32,
    U64,
}

impl SourceDType {
    /// Maps a safetensors `dtype` string; `None` for strings this reader does not know
    /// (including the sub-byte F4/F6 types).
    pub fn from_safetensors(dtype: &str) -> Option<SourceDType> {
        use SourceDType::*;
        Some(match dtype {
            "F16" => Ggml(DType::F16),
            "BF16" => Ggml(DType::BF16),
            "F32" => Ggml(DType::F32),
            "I8" => Ggml(DType::I8),
            "I16" => Ggml(DType::I16),
            "I32" => Ggml(DType::I32),
            "F64" => F64,
            "I64" => I64,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            "F8_E8M0" => F8E8M0,
            "U8" => U8,
            "BOOL" => Bool,
            "U16" => U16,
            "U32" => U32,
            "U64" => U64,
            _ => return None,
        })
    }

    /// A short name for messages (safetensors spelling, or the ggml name for ggml types).
    pub fn name(self) -> &'static str {
        use SourceDType::*;
        match self {
            Ggml(t) => t.name(),
            F64 => "F64",
            I64 => "I64",
            F8E4M3 => "F8_E4M3",
            F8E5M2 => "F8_E5M2",
            F8E8M0 => "F8_E8M0",
            U8 => "U8",
            Bool => "BOOL",
            U16 => "U16",
            U32 => "U32",
            U64 => "U64",
        }
    }

    /// The ggml type the tensor is loaded as; `None` for types that are skipped.
    pub fn load_dtype(self) -> Option<DType> {
        use SourceDType::*;
        match self {
            Ggml(t) => Some(t),
            F64 => Some(DType::F32),
            I64 => Some(DType::I32),
            F8E4M3 | F8E5M2 => Some(DType::F16),
            F8E8M0 | U8 | Bool | U16 | U32 | U64 => None,
        }
    }

    /// True when loading needs [`convert_for_load`] (the file bytes differ from ggml's layout).
    pub fn needs_conversion(self) -> bool {
        !matches!(self, SourceDType::Ggml(_))
    }

    /// Bytes per element for element-wise types; `None` for block-quantized ggml types.
    pub fn elem_size(self) -> Option<u32> {
        use SourceDType::*;
        match self {
            Ggml(t) if t.block_size() == 1 => Some(t.type_size()),
            Ggml(_) => None,
            F64 | I64 | U64 => Some(8),
            U32 => Some(4),
            U16 => Some(2),
            F8E4M3 | F8E5M2 | F8E8M0 | U8 | Bool => Some(1),
        }
    }

    /// Bytes in the file of a tensor with ggml shape `ne`; `None` on overflow or partial blocks.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        match self {
            SourceDType::Ggml(t) => t.nbytes(ne),
            other => {
                let mut total = u64::from(other.elem_size()?);
                for &n in ne {
                    total = total.checked_mul(n)?;
                }
                Some(total)
            }
        }
    }
}

impl fmt::Display for SourceDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes one F8_E4M3FN value (bias 7, subnormals, S.1111.111 is NaN, no infinities).
pub fn f8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * 2f32.powi(-9) // subnormal: (m/8) * 2^(1-7)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// Decodes one F8_E5M2 value: it is exactly the high byte of an IEEE half.
pub fn f8_e5m2_to_f32(b: u8) -> f32 {
    half::f16::from_bits(u16::from(b) << 8).to_f32()
}

/// Decodes one F8_E8M0 scale: 2^(b-127), 0xff is NaN.
pub fn f8_e8m0_to_f32(b: u8) -> f32 {
    if b == 0xff {
        f32::NAN
    } else {
        2f32.powi(i32::from(b) - 127)
    }
}

fn chunks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

fn check_len(src: SourceDType, bytes: &[u8]) -> Result<usize> {
    let size = src.elem_size().ok_or_else(|| WeightsError::Convert {
        key: String::new(),
        reason: format!("{} is block-quantized; dequantize it with ggml", src.name()),
    })? as usize;
    if !bytes.len().is_multiple_of(size) {
        return Err(WeightsError::Convert {
            key: String::new(),
            reason: format!(
                "{} bytes is not a whole number of {}-byte {} elements",
                bytes.len(),
                size,
                src.name()
            ),
        });
    }
    Ok(bytes.len() / size)
}

/// Converts little-endian element data of type `src` to f32 on the CPU.
///
/// Supports every element-wise type (F32, F16, BF16, F64, F8 variants, signed and unsigned
/// integers, BOOL); block-quantized ggml types return [`WeightsError::Convert`].
pub fn to_f32(src: SourceDType, bytes: &[u8]) -> Result<Vec<f32>> {
    use SourceDType as S;
    check_len(src, bytes)?;
    let out: Vec<f32> = match src {
        S::Ggml(DType::F32) => chunks::<4>(bytes).map(f32::from_le_bytes).collect(),
        S::Ggml(DType::F16) => chunks::<2>(bytes)
            .map(|c| half::f16::from_le_bytes(c).to_f32())
            .collect(),
        S::Ggml(DType::BF16) => chunks::<2>(bytes)
            .map(|c| half::bf16::from_le_bytes(c).to_f32())
            .collect(),
        S::Ggml(DType::F64) | S::F64 => chunks::<8>(bytes)
            .map(|c| f64::from_le_bytes(c) as f32)
            .collect(),
        S::Ggml(DType::I8) => bytes.iter().map(|&b| f32::from(b as i8)).collect(),
        S::Ggml(DType::I16) => chunks::<2>(bytes)
            .map(|c| f32::from(i16::from_le_bytes(c)))
            .collect(),
        S::Ggml(DType::I32) => chunks::<4>(bytes)
            .map(|c| i32::from_le_bytes(c) as f32)
            .collect(),
        S::Ggml(DType::I64) | S::I64 => chunks::<8>(bytes)
            .map(|c| i64::from_le_bytes(c) as f32)
            .collect(),
        S::Ggml(_) => unreachable_quantized(src)?,
        S::F8E4M3 => bytes.iter().map(|&b| f8_e4m3_to_f32(b)).collect(),
        S::F8E5M2 => bytes.iter().map(|&b| f8_e5m2_to_f32(b)).collect(),
        S::F8E8M0 => bytes.iter().map(|&b| f8_e8m0_to_f32(b)).collect(),
        S::U8 => bytes.iter().map(|&b| f32::from(b)).collect(),
        S::Bool => bytes.iter().map(|&b| f32::from(u8::from(b != 0))).collect(),
        S::U16 => chunks::<2>(bytes)
            .map(|c| f32::from(u16::from_le_bytes(c)))
            .collect(),
        S::U32 => chunks::<4>(bytes)
            .map(|c| u32::from_le_bytes(c) as f32)
            .collect(),
        S::U64 => chunks::<8>(bytes)
            .map(|c| u64::from_le_bytes(c) as f32)
            .collect(),
    };
    Ok(out)
}

// check_len already rejects block types; this keeps the match total without a panic.
fn unreachable_quantized(src: SourceDType) -> Result<Vec<f32>> {
    Err(WeightsError::Convert {
        key: String::new(),
        reason: format!("{} cannot be converted on the CPU here", src.name()),
    })
}

/// Returns the bytes of a tensor in its load type ([`SourceDType::load_dtype`]): borrowed when
/// no conversion is needed, otherwise converted (F8 → F16, F64 → F32, I64 → I32 saturating).
pub fn convert_for_load(src: SourceDType, bytes: &[u8]) -> Result<Cow<'_, [u8]>> {
    use SourceDType as S;
    match src {
        S::Ggml(_) => Ok(Cow::Borrowed(bytes)),
        S::F8E4M3 => {
            check_len(src, bytes)?;
            let mut out = Vec::with_capacity(bytes.len() * 2);
            for &b in bytes {
                // Every E4M3 value, NaN included, is exactly representable in f16.
                out.extend_from_slice(&half::f16::from_f32(f8_e4m3_to_f32(b)).to_le_bytes());
            }
            Ok(Cow::Owned(out))
        }
        S::F8E5M2 => {
            check_len(src, bytes)?;
            let mut out = Vec::with_capacity(bytes.len() * 2);
            for &b in bytes {
                out.extend_from_slice(&(u16::from(b) << 8).to_le_bytes());
            }
            Ok(Cow::Owned(out))
        }
        S::F64 => {
            check_len(src, bytes)?;
            let mut out = Vec::with_capacity(bytes.len() / 2);
            for c in chunks::<8>(bytes) {
                out.extend_from_slice(&(f64::from_le_bytes(c) as f32).to_le_bytes());
            }
            Ok(Cow::Owned(out))
        }
        S::I64 => {
            check_len(src, bytes)?;
            let mut out = Vec::with_capacity(bytes.len() / 2);
            for c in chunks::<8>(bytes) {
                let v = i64::from_le_bytes(c).clamp(i64::from(i32::MIN), i64::from(i32::MAX));
                out.extend_from_slice(&(v as i32).to_le_bytes());
            }
            Ok(Cow::Owned(out))
        }
        S::F8E8M0 | S::U8 | S::Bool | S::U16 | S::U32 | S::U64 => Err(WeightsError::Convert {
            key: String::new(),
            reason: format!("{} tensors are not loaded into ggml", src.name()),
        }),
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
    }

    #[test]
    fn row_bytes_checks_blocks() {
        assert_eq!(DType::Q4_K.row_bytes(512).unwrap(), 288);
        assert!(matches!(
            DType::Q4_K.row_bytes(100),
            Err(WeightsError::RowSize { .. })
        ));
        assert_eq!(DType::F16.row_bytes(3).unwrap(), 6);
        assert_eq!(DType::F32.nbytes(&[u64::MAX, 2]), None);
    }

    #[test]
    fn f8_decoders() {
        assert_eq!(f8_e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(f8_e4m3_to_f32(0x38), 1.0);
        assert!(f8_e4m3_to_f32(0xff).is_nan());
        assert_eq!(f8_e5m2_to_f32(0x3c), 1.0);
        assert_eq!(f8_e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(f8_e8m0_to_f32(127), 1.0);
    }

    #[test]
    fn f8_to_f16_is_exact_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        for src in [SourceDType::F8E4M3, SourceDType::F8E5M2] {
            let f32s = to_f32(src, &all).unwrap();
            let f16s = convert_for_load(src, &all).unwrap();
            let back = to_f32(SourceDType::Ggml(DType::F16), &f16s).unwrap();
            for (a, b) in f32s.iter().zip(&back) {
                assert!(a == b || (a.is_nan() && b.is_nan()), "{src}: {a} vs {b}");
            }
        }
    }
}
