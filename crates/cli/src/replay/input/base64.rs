//! Standard base64 (RFC 4648, with or without padding), as HAR files and
//! Envoy tap traces write bodies.

/// The bytes `text` encodes.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    let mut padding = 0usize;
    for (i, c) in text.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            b'\r' | b'\n' | b' ' => continue,
            _ => return Err(format!("not base64 (byte {} is {:?})", i + 1, c as char)),
        };
        if padding > 0 {
            return Err("not base64 (data after padding)".to_string());
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 || padding > 2 {
        return Err("not base64 (truncated)".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_padded_unpadded_and_refuses_garbage() {
        assert_eq!(decode("").unwrap(), b"");
        assert_eq!(decode("Zg==").unwrap(), b"f");
        assert_eq!(decode("Zm8=").unwrap(), b"fo");
        assert_eq!(decode("Zm9v").unwrap(), b"foo");
        assert_eq!(decode("Zm9vYg").unwrap(), b"foob");
        assert_eq!(decode("aMOpbGxv\n").unwrap(), "héllo".as_bytes());
        assert!(decode("Zm9v!").unwrap_err().contains("byte 5"));
        assert!(decode("Zg==Zg").is_err());
        assert!(decode("Z").is_err());
    }
}
