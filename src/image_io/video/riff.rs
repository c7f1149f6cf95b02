//! RIFF chunk writing shared by the AVI and WebP containers: a chunk is a FourCC, a
//! little-endian u32 payload size and the payload, padded to an even length (the pad byte is
//! not counted in the size).

/// A size did not fit RIFF's 32-bit fields.
#[derive(Debug)]
pub(super) struct Overflow;

/// A RIFF byte buffer under construction.
#[derive(Default)]
pub(super) struct RiffWriter {
    buf: Vec<u8>,
}

impl RiffWriter {
    pub fn new() -> RiffWriter {
        RiffWriter::default()
    }

    /// The offset the next chunk starts at.
    pub fn pos(&self) -> usize {
        self.buf.len()
    }

    pub fn bytes(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    /// The low three bytes of `v` (WebP's 24-bit fields); the caller keeps `v` in range.
    pub fn u24(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes()[..3]);
    }

    /// A whole chunk with its pad byte.
    pub fn chunk(&mut self, id: &[u8; 4], payload: &[u8]) -> Result<(), Overflow> {
        let size = u32::try_from(payload.len()).map_err(|_| Overflow)?;
        self.bytes(id);
        self.u32(size);
        self.bytes(payload);
        if payload.len() % 2 == 1 {
            self.buf.push(0);
        }
        Ok(())
    }

    /// Starts a chunk `id` whose payload follows; returns the token for [`RiffWriter::close`].
    pub fn begin(&mut self, id: &[u8; 4]) -> usize {
        self.bytes(id);
        let at = self.buf.len();
        self.u32(0);
        at
    }

    /// Starts a `RIFF`/`LIST` container `id` of type `form`; returns the token for
    /// [`RiffWriter::close`].
    pub fn open(&mut self, id: &[u8; 4], form: &[u8; 4]) -> usize {
        let at = self.begin(id);
        self.bytes(form);
        at
    }

    /// Ends the chunk `begin`/`open` returned `at` for: writes its size, then a pad byte if odd.
    pub fn close(&mut self, at: usize) -> Result<(), Overflow> {
        let size = u32::try_from(self.buf.len() - at - 4).map_err(|_| Overflow)?;
        self.buf[at..at + 4].copy_from_slice(&size.to_le_bytes());
        if size % 2 == 1 {
            self.buf.push(0);
        }
        Ok(())
    }

    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_padded_and_sized() {
        let mut w = RiffWriter::new();
        let at = w.open(b"LIST", b"test");
        w.chunk(b"abcd", b"xyz").unwrap();
        w.close(at).unwrap();
        let b = w.into_inner();
        assert_eq!(&b[..4], b"LIST");
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 4 + 8 + 4);
        assert_eq!(&b[12..16], b"abcd");
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 3);
        assert_eq!(&b[20..], b"xyz\0");
    }
}
