//! The little of EBML (Matroska's binary XML) that a WebM writer needs: elements as
//! `ID, size, payload`, with sizes as variable-length integers.

/// Appends `id` (its bytes already carry the EBML length marker, as the specs list them).
fn put_id(out: &mut Vec<u8>, id: u32) {
    let bytes = id.to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count().min(3);
    out.extend_from_slice(&bytes[skip..]);
}

/// Appends `size` as the shortest EBML variable-length integer (all-ones is reserved for
/// "unknown", so a length of n bytes holds up to 2^(7n) − 2).
fn put_size(out: &mut Vec<u8>, size: u64) {
    let len = (1..=8usize)
        .find(|&n| size < (1u64 << (7 * n)) - 1)
        .unwrap_or(8);
    let marked = size | (1u64 << (7 * len));
    out.extend_from_slice(&marked.to_be_bytes()[8 - len..]);
}

/// One element with a binary payload.
pub(super) fn element(out: &mut Vec<u8>, id: u32, payload: &[u8]) {
    put_id(out, id);
    put_size(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// An unsigned integer element in its shortest big-endian form.
pub(super) fn uint(out: &mut Vec<u8>, id: u32, v: u64) {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|&&b| b == 0).count().min(7);
    element(out, id, &bytes[skip..]);
}

/// An unsigned integer element always 8 bytes long, so that the element's size does not
/// depend on the value (seek positions written before they are known).
pub(super) fn uint8(out: &mut Vec<u8>, id: u32, v: u64) {
    element(out, id, &v.to_be_bytes());
}

pub(super) fn float(out: &mut Vec<u8>, id: u32, v: f64) {
    element(out, id, &v.to_be_bytes());
}

pub(super) fn string(out: &mut Vec<u8>, id: u32, s: &str) {
    element(out, id, s.as_bytes());
}

/// A master element holding what `fill` writes.
pub(super) fn master(out: &mut Vec<u8>, id: u32, fill: impl FnOnce(&mut Vec<u8>)) {
    let mut body = Vec::new();
    fill(&mut body);
    element(out, id, &body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ids_use_the_shortest_forms() {
        let mut v = Vec::new();
        put_size(&mut v, 0);
        put_size(&mut v, 126);
        put_size(&mut v, 127);
        put_size(&mut v, 300);
        assert_eq!(v, [0x80, 0xfe, 0x40, 0x7f, 0x41, 0x2c]);
        let mut v = Vec::new();
        put_id(&mut v, 0x1A45_DFA3);
        put_id(&mut v, 0xA3);
        put_id(&mut v, 0x4286);
        assert_eq!(v, [0x1a, 0x45, 0xdf, 0xa3, 0xa3, 0x42, 0x86]);
        let mut v = Vec::new();
        uint(&mut v, 0xD7, 1);
        uint(&mut v, 0xB0, 832);
        assert_eq!(v, [0xd7, 0x81, 0x01, 0xb0, 0x82, 0x03, 0x40]);
    }
}
