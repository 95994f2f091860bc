//! A pattern's syntax error in PCRE2's words, as MongoDB reports it.
//!
//! MongoDB compiles `$regex` and the `$regex*` expressions with PCRE2 and
//! puts PCRE2's compile error text after its own prefix: `Regular expression
//! is invalid: missing closing parenthesis` (51091, queries), `Invalid Regex
//! in $regexMatch: missing closing parenthesis` (51111). Duet compiles with
//! the `regex` crate, whose errors say the same things in other words; this
//! module names the kind of error (`regex-syntax`'s, the parser the `regex`
//! crate uses) and answers with PCRE2's text for it (`pcre2_error.c`).
//!
//! Invariants: the parse here uses the same flags as the compile it explains
//! (`x` changes what is a syntax error); an error PCRE2 has no counterpart
//! for (PCRE2 syntax neither the `regex` crate nor the backtracking engine
//! of `query/pattern.rs` accepts, `\Q…\E` say) keeps the `regex` crate's
//! own one-line reason, so the answer still says why.

use regex_syntax::ast::ErrorKind as A;
use regex_syntax::hir::ErrorKind as H;

/// PCRE2's words for why `pattern` (compiled with `options`, MongoDB's flag
/// letters) failed to compile with `err`.
pub fn compile_error(pattern: &str, options: &str, err: &regex::Error) -> String {
    if let regex::Error::CompiledTooBig(_) = err {
        return "regular expression is too large".into();
    }
    let parsed = regex_syntax::ParserBuilder::new()
        .ignore_whitespace(options.contains('x'))
        .case_insensitive(options.contains('i'))
        .multi_line(options.contains('m'))
        .dot_matches_new_line(options.contains('s'))
        .build()
        .parse(pattern);
    let words = match &parsed {
        Err(regex_syntax::Error::Parse(e)) => ast_words(e.kind(), e.pattern(), e.span()),
        Err(regex_syntax::Error::Translate(e)) => hir_words(e.kind()),
        _ => None,
    };
    words.map(str::to_string).unwrap_or_else(|| own_reason(err))
}

fn ast_words(kind: &A, pattern: &str, span: &regex_syntax::ast::Span) -> Option<&'static str> {
    Some(match kind {
        A::ClassUnclosed => "missing terminating ] for character class",
        A::ClassRangeInvalid => "range out of order in character class",
        A::ClassRangeLiteral => "invalid range in character class",
        A::ClassEscapeInvalid => "escape sequence is invalid in character class",
        A::RepetitionCountInvalid => "numbers out of order in {} quantifier",
        A::DecimalInvalid => "number too big in {} quantifier",
        A::RepetitionMissing => "quantifier does not follow a repeatable item",
        A::EscapeUnexpectedEof => "\\ at end of pattern",
        A::EscapeUnrecognized => "unrecognized character follows \\",
        A::EscapeHexEmpty => "digits missing in \\x{} or \\o{} or \\N{U+}",
        A::EscapeHexInvalidDigit => "non-hex character in \\x{} (closing brace missing?)",
        A::EscapeHexInvalid => "character code point value in \\x{} or \\o{} is too large",
        A::FlagUnrecognized
        | A::FlagDanglingNegation
        | A::FlagRepeatedNegation { .. }
        | A::FlagUnexpectedEof => "unrecognized character after (? or (?-",
        A::GroupNameDuplicate { .. } => {
            "two named subpatterns have the same name (PCRE2_DUPNAMES not set)"
        }
        A::GroupNameEmpty => "subpattern name expected",
        A::GroupNameInvalid => {
            let at = pattern
                .get(span.start.offset..)
                .and_then(|s| s.chars().next());
            if at.is_some_and(|c| c.is_ascii_digit()) {
                "subpattern name must start with a non-digit"
            } else {
                "syntax error in subpattern name (missing terminator?)"
            }
        }
        A::GroupNameUnexpectedEof => "syntax error in subpattern name (missing terminator?)",
        A::GroupUnclosed => "missing closing parenthesis",
        A::GroupUnopened => "unmatched closing parenthesis",
        A::NestLimitExceeded(_) => "parentheses are too deeply nested",
        A::CaptureLimitExceeded => "too many capturing groups (maximum 65535)",
        A::UnicodeClassInvalid => "unknown property name after \\P or \\p",
        _ => return None,
    })
}

fn hir_words(kind: &H) -> Option<&'static str> {
    Some(match kind {
        H::UnicodePropertyNotFound | H::UnicodePropertyValueNotFound => {
            "unknown property name after \\P or \\p"
        }
        _ => return None,
    })
}

/// The `regex` crate's reason on one line (its message repeats the pattern
/// with a caret under the fault, then `error: <reason>`).
fn own_reason(err: &regex::Error) -> String {
    let text = err.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .unwrap_or(text.lines().last().unwrap_or(""))
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pattern: &str, options: &str) -> String {
        let err = regex::RegexBuilder::new(pattern)
            .ignore_whitespace(options.contains('x'))
            .build()
            .expect_err("invalid");
        compile_error(pattern, options, &err)
    }

    #[test]
    fn common_mistakes_read_as_pcre2_does() {
        for (p, want) in [
            ("a(b", "missing closing parenthesis"),
            ("ab)", "unmatched closing parenthesis"),
            ("[a-", "missing terminating ] for character class"),
            ("[z-a]", "range out of order in character class"),
            ("*a", "quantifier does not follow a repeatable item"),
            ("a{3,1}", "numbers out of order in {} quantifier"),
            ("a\\", "\\ at end of pattern"),
            ("(?<1a>x)", "subpattern name must start with a non-digit"),
            (
                "(?<n>a)(?<n>b)",
                "two named subpatterns have the same name (PCRE2_DUPNAMES not set)",
            ),
            ("\\p{Nope}", "unknown property name after \\P or \\p"),
        ] {
            assert_eq!(words(p, ""), want, "{p}");
        }
        // With `x`, a `#` starts a comment: `(#)` is an unclosed group.
        assert_eq!(words("(#)", "x"), "missing closing parenthesis");
        // No PCRE2 counterpart: the regex crate's one-line reason.
        assert_eq!(words("(a)\\1", ""), "backreferences are not supported");
    }
}
