//! Element types as stored in files.
//!
//! [`DType`] (the ggml tensor type, [`crate::dtype`]) is what a tensor loads as;
//! [`SourceDType`] is the element type as stored in a file, which for safetensors may be a type
//! ggml cannot hold directly (F8, I64, F64...); it knows which `DType` the tensor becomes on load
//! and how to convert the bytes.

use std::borrow::Cow;
use std::fmt;

use crate::dtype::DType;

use super::error::{Result, WeightsError};

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
            Ggml(t) if t.block_size() == 1 => Some(t.type_size() as u32),
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
