//! Row conversion of f32 data into any ggml type (used by `--type` and `-M convert`).

use thiserror::Error;

use super::sys;
use crate::dtype::DType;

#[derive(Debug, Error)]
pub enum QuantizeError {
    #[error("cannot convert to {ty}: ggml has no plain f32 conversion for it (it needs an importance matrix or is not a storage type)")]
    Unsupported { ty: String },
    #[error("cannot convert rows of {n_per_row} elements to {ty}: the row length must be a multiple of {block}")]
    RowLength {
        ty: String,
        n_per_row: usize,
        block: usize,
    },
    #[error("{len} values are not a whole number of rows of {n_per_row}")]
    Ragged { len: usize, n_per_row: usize },
}

/// Converts `data` (rows of `n_per_row` f32) to `ty`, returning the packed bytes.
pub fn quantize_rows(ty: DType, data: &[f32], n_per_row: usize) -> Result<Vec<u8>, QuantizeError> {
    if !ty.can_quantize_from_f32() {
        return Err(QuantizeError::Unsupported {
            ty: ty.name().to_string(),
        });
    }
    let row_bytes = ty.row_bytes(n_per_row).ok_or(QuantizeError::RowLength {
        ty: ty.name().to_string(),
        n_per_row,
        block: ty.block_size(),
    })?;
    if n_per_row == 0 || !data.len().is_multiple_of(n_per_row) {
        return Err(QuantizeError::Ragged {
            len: data.len(),
            n_per_row,
        });
    }
    let rows = data.len() / n_per_row;
    let mut out = vec![0u8; rows * row_bytes];
    if rows == 0 {
        return Ok(out);
    }
    // SAFETY: `data` holds rows*n_per_row floats, `out` rows*row_bytes bytes, the row length is
    // a whole number of blocks, and the type needs no importance matrix (checked above).
    unsafe {
        sys::ggml_quantize_init(ty.raw());
        sys::ggml_quantize_chunk(
            ty.raw(),
            data.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        );
    }
    Ok(out)
}

/// Converts packed rows of `ty` (any type with a ggml f32 conversion) back to f32.
pub fn dequantize_rows(
    ty: DType,
    bytes: &[u8],
    n_per_row: usize,
) -> Result<Vec<f32>, QuantizeError> {
    let row_bytes = ty.row_bytes(n_per_row).ok_or(QuantizeError::RowLength {
        ty: ty.name().to_string(),
        n_per_row,
        block: ty.block_size(),
    })?;
    if row_bytes == 0 || !bytes.len().is_multiple_of(row_bytes) {
        return Err(QuantizeError::Ragged {
            len: bytes.len(),
            n_per_row,
        });
    }
    // SAFETY: static table entry for an in-range type id.
    let traits = unsafe { sys::ggml_get_type_traits(ty.raw()) };
    // SAFETY: non-null pointer into ggml's static type table.
    let to_float = if traits.is_null() {
        None
    } else {
        unsafe { (*traits).to_float }
    };
    let to_float = to_float.ok_or(QuantizeError::Unsupported {
        ty: ty.name().to_string(),
    })?;
    let n = bytes.len() / row_bytes * n_per_row;
    let mut out = vec![0f32; n];
    // SAFETY: `bytes` holds n / n_per_row whole rows of `ty`, and `out` has room for n floats.
    unsafe { to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
    Ok(out)
}
