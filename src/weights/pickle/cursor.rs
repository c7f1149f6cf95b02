//! Bounds-checked reads of opcode arguments. Every length read from the pickle is checked
//! against the bytes that remain before anything is taken or allocated.

/// A read position in a pickle.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Why a read failed (the machine adds the file, part and offset).
pub(super) type ReadResult<T> = Result<T, String>;

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes (`what` names the argument in the error).
    pub(super) fn take(&mut self, n: u64, what: &str) -> ReadResult<&'a [u8]> {
        let left = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(format!(
                "the pickle ends inside {what} (it needs {n} bytes, {left} remain)"
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> ReadResult<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    pub(super) fn u8(&mut self, what: &str) -> ReadResult<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(super) fn u16(&mut self, what: &str) -> ReadResult<u16> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(super) fn u32(&mut self, what: &str) -> ReadResult<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(super) fn i32(&mut self, what: &str) -> ReadResult<i32> {
        self.array(what).map(i32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, what: &str) -> ReadResult<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub(super) fn f64_be(&mut self, what: &str) -> ReadResult<f64> {
        self.array(what).map(f64::from_be_bytes)
    }

    /// A newline-terminated argument (protocol 0), without its newline.
    pub(super) fn line(&mut self, what: &str) -> ReadResult<&'a [u8]> {
        let rest = &self.bytes[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(format!("the pickle ends inside {what} (no newline)")),
        }
    }
}

/// Little-endian two's complement bytes as an `i64`, `None` when wider.
pub(super) fn le_int(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() {
        return Some(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    if bytes.len() > 8 {
        // Wider encodings still fit when the extra bytes only repeat the sign.
        let (low, high) = bytes.split_at(8);
        if high.iter().any(|&b| b != fill) || (low[7] & 0x80 != 0) != negative {
            return None;
        }
        return le_int(low);
    }
    let mut a = [fill; 8];
    a[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_encodings() {
        assert_eq!(le_int(&[]), Some(0));
        assert_eq!(le_int(&[0xff]), Some(-1));
        assert_eq!(le_int(&[0x80, 0x00]), Some(128));
        assert_eq!(le_int(&[0x00, 0x01]), Some(256));
        assert_eq!(le_int(&[0xff; 9]), Some(-1));
        assert_eq!(le_int(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(
            le_int(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00]),
            Some(i64::MAX)
        );
    }

    #[test]
    fn lengths_are_checked_before_reading() {
        let mut c = Cursor::new(b"abc");
        assert!(c.take(u64::MAX, "x").is_err());
        assert!(c.take(4, "x").is_err());
        assert_eq!(c.take(3, "x").unwrap(), b"abc");
        assert!(c.u8("x").is_err());
        assert!(Cursor::new(b"no newline").line("x").is_err());
    }
}
