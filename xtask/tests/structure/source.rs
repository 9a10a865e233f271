//! Rust source as a list of tokens: identifiers, `::` and single punctuation
//! characters, with comments, string and character literals and numbers left
//! out. Enough to find `mod`, `use` and paths; not a Rust parser.

/// The tokens of `source`.
pub fn tokens(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i);
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if let Some(end) = raw_or_byte_string(&chars, i) {
            i = end;
        } else if c == '\'' {
            i = skip_char_or_lifetime(&chars, i);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Past the block comment that starts at `i` (block comments nest).
fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Past the closing quote of a string whose content starts at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Past a raw string (`r"…"`, `r#"…"#`), a byte string (`b"…"`, `br"…"`), a C
/// string (`c"…"`) or a byte (`b'x'`) that starts at `i`, if one does.
fn raw_or_byte_string(chars: &[char], i: usize) -> Option<usize> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if matches!(chars[j], 'b' | 'c') {
        j += 1;
        match chars.get(j) {
            Some('"') => return Some(skip_string(chars, j + 1)),
            Some('\'') if chars[i] == 'b' => return Some(skip_char_or_lifetime(chars, j)),
            _ => {}
        }
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

/// Past a character literal (`'x'`, `'\n'`, `'\u{1F600}'`) or a lifetime (`'a`) at `i`.
fn skip_char_or_lifetime(chars: &[char], i: usize) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        // A lifetime or a label: the name is not a token that matters here.
        _ => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            j
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tokens;

    #[test]
    fn comments_strings_and_chars_are_left_out() {
        let source = r###"
            use crate::a; // use crate::b;
            /* mod c; /* nested */ use crate::d; */
            let s = "use crate::e; \" still";
            let r = r#"use crate::f; "quoted""#;
            let bytes = b"crate::g"; let q = '"'; let n = '\''; let l: &'static str = x;
        "###;
        let found = tokens(source);
        let text = found.join(" ");
        assert!(text.contains("use crate :: a ;"), "{text}");
        for hidden in ["b", "c", "d", "e", "f", "g"] {
            assert!(!found.contains(&hidden.to_string()), "{hidden} should be hidden: {text}");
        }
        assert!(text.ends_with("let l : & str = x ;"), "{text}");
    }
}
