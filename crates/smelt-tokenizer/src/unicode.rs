//! Character classes and the GPT-2 byte alphabet, as llama.cpp's `unicode.cpp` uses them.

use std::sync::OnceLock;

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// The classes llama.cpp's hand-written pre-tokenizers test. `present` is false only for the
/// positions outside the piece being scanned (llama.cpp's all-zero flags); every real code
/// point, assigned or not, has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    pub letter: bool,
    pub number: bool,
    pub whitespace: bool,
    pub present: bool,
}

/// Unicode White_Space, the set llama.cpp's tables mark as whitespace.
///
/// Categories are Unicode 15.1's, the data llama.cpp's `unicode-data.cpp` was generated from
/// (`unicode-general-category` 0.6 has 15.0, plus 15.1's 627 additions below): characters
/// assigned later are "undefined" there, and must be here too.
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{09}'..='\u{0D}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

pub(crate) fn flags(c: char) -> Flags {
    if c.is_ascii() {
        return Flags {
            letter: c.is_ascii_alphabetic(),
            number: c.is_ascii_digit(),
            whitespace: is_whitespace(c),
            present: true,
        };
    }
    let cat = category(c);
    Flags {
        letter: cat == Category::Letter,
        number: cat == Category::Number,
        whitespace: is_whitespace(c),
        present: true,
    }
}

/// The stand-in llama.cpp's regex path gives a code point (`unicode_regex_split`'s "collapsed"
/// text): ASCII stays itself, other whitespace becomes `\x0B`, and every other code point
/// becomes one character per category, so that patterns can name categories with ASCII-only
/// classes. Private-use characters play llama.cpp's bytes 0xD0..0xD5.
pub(crate) fn collapse(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    if is_whitespace(c) {
        return '\x0B';
    }
    match category(c) {
        Category::Number => COLLAPSED_NUMBER,
        Category::Letter => COLLAPSED_LETTER,
        Category::Punctuation => COLLAPSED_PUNCTUATION,
        Category::Mark => COLLAPSED_MARK,
        Category::Symbol => COLLAPSED_SYMBOL,
        Category::Other => '\u{E0D0}',
    }
}

pub(crate) const COLLAPSED_NUMBER: char = '\u{E0D1}';
pub(crate) const COLLAPSED_LETTER: char = '\u{E0D2}';
pub(crate) const COLLAPSED_PUNCTUATION: char = '\u{E0D3}';
pub(crate) const COLLAPSED_MARK: char = '\u{E0D4}';
pub(crate) const COLLAPSED_SYMBOL: char = '\u{E0D5}';

#[derive(Clone, Copy, PartialEq, Eq)]
enum Category {
    Number,
    Letter,
    Punctuation,
    Mark,
    Symbol,
    Other,
}

fn category(c: char) -> Category {
    use G::*;
    // Unicode 15.1's additions to the 15.0 data: llama.cpp's table is 15.1
    match c {
        '\u{2FFC}'..='\u{2FFF}' | '\u{31EF}' => return Category::Symbol,
        '\u{2EBF0}'..='\u{2EE5D}' => return Category::Letter,
        _ => {}
    }
    match get_general_category(c) {
        DecimalNumber | LetterNumber | OtherNumber => Category::Number,
        UppercaseLetter | LowercaseLetter | TitlecaseLetter | ModifierLetter | OtherLetter => {
            Category::Letter
        }
        ConnectorPunctuation | DashPunctuation | OpenPunctuation | ClosePunctuation
        | InitialPunctuation | FinalPunctuation | OtherPunctuation => Category::Punctuation,
        NonspacingMark | SpacingMark | EnclosingMark => Category::Mark,
        MathSymbol | CurrencySymbol | ModifierSymbol | OtherSymbol => Category::Symbol,
        _ => Category::Other,
    }
}

/// GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
/// themselves, the rest are moved up to U+0100.. in byte order.
fn byte_table() -> &'static ([char; 256], std::collections::HashMap<char, u8>) {
    static TABLE: OnceLock<([char; 256], std::collections::HashMap<char, u8>)> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut chars = ['\0'; 256];
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut n = 0u32;
        for b in 0..256u32 {
            let cp = if printable(b) {
                b
            } else {
                n += 1;
                255 + n
            };
            chars[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        let rev = chars
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        (chars, rev)
    })
}

/// Appends the byte-level encoding of `s` (every UTF-8 byte as its GPT-2 character).
pub(crate) fn byte_encode_into(s: &str, out: &mut String) {
    let (chars, _) = byte_table();
    for &b in s.as_bytes() {
        out.push(chars[b as usize]);
    }
}

/// The byte a GPT-2 alphabet character stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    byte_table().1.get(&c).copied()
}

/// The GPT-2 alphabet character of a byte.
#[cfg(test)]
pub(crate) fn byte_to_char(b: u8) -> char {
    byte_table().0[b as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
    }

    #[test]
    fn classes() {
        assert!(flags('é').letter);
        assert!(flags('中').letter);
        assert!(flags('٣').number);
        assert!(flags('\u{3000}').whitespace);
        assert!(!flags('😀').letter && flags('😀').present);
    }
}
