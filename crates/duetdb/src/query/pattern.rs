//! One compiled regular expression, as MongoDB's PCRE2 accepts it: the
//! filter's `$regex`, the `$regexMatch`/`$regexFind`/`$regexFindAll`
//! expressions and `$jsonSchema`'s `pattern` compile here.
//!
//! Two engines. The `regex` crate (linear time in the input, no
//! backtracking) compiles every pattern it can; a pattern it refuses only
//! because it uses what needs backtracking — backreferences (`(a)\1`),
//! look-around (`(?=…)`, `(?<!…)`), atomic groups, possessive quantifiers —
//! compiles with `fancy-regex`, which runs those parts by backtracking and
//! hands the rest to the `regex` crate.
//!
//! Invariants: a pattern the `regex` crate accepts never takes the
//! backtracking engine (its matching stays linear); a backtracking match is
//! bounded by [`BACKTRACK_LIMIT`] steps, so no input makes a match run
//! unbounded: past it the match is an error ([`MatchError`]) the caller
//! turns into MongoDB's behaviour (no match in a filter, as PCRE2's match
//! limit is there; 51156 in an expression); compiled size is bounded
//! ([`SIZE_LIMIT`]) in both engines; a pattern neither engine accepts
//! reports the `regex` crate's error, which `pcre_words` puts in PCRE2's
//! words.

/// Compiled size bound of one pattern, so that a hostile pattern cannot
/// take unbounded memory.
pub const SIZE_LIMIT: usize = 4 << 20;

/// Backtracking steps one match may take (`fancy-regex`'s own default;
/// PCRE2's match limit is 10 M, but a filter runs one match per document).
pub const BACKTRACK_LIMIT: usize = 1_000_000;

/// Why a pattern did not compile.
#[derive(Debug)]
pub enum CompileError {
    /// An option letter MongoDB does not know.
    Flag(char),
    /// The `regex` crate's error (the backtracking engine refused it too).
    Syntax(regex::Error),
}

/// A backtracking match passed [`BACKTRACK_LIMIT`] (or failed otherwise).
#[derive(Debug)]
pub struct MatchError(pub String);

/// A compiled pattern.
#[derive(Debug, Clone)]
pub enum Pattern {
    Linear(regex::Regex),
    Backtracking(fancy_regex::Regex),
}

/// Where a match and its groups lie in the input (byte offsets); group 0 is
/// the whole match, `None` a group that took no part.
pub type Groups = Vec<Option<(usize, usize)>>;

/// Compile `pattern` with MongoDB's option letters (`i`, `m`, `s`, `x`,
/// `u`). The caller refuses an embedded NUL first (its message differs per
/// operator).
pub fn compile(pattern: &str, options: &str) -> Result<Pattern, CompileError> {
    let mut linear = regex::RegexBuilder::new(pattern);
    linear.size_limit(SIZE_LIMIT);
    let mut fancy = fancy_regex::RegexBuilder::new(pattern);
    fancy
        .backtrack_limit(BACKTRACK_LIMIT)
        .delegate_size_limit(SIZE_LIMIT);
    for c in options.chars() {
        match c {
            'i' => {
                linear.case_insensitive(true);
                fancy.case_insensitive(true);
            }
            'm' => {
                linear.multi_line(true);
                fancy.multi_line(true);
            }
            's' => {
                linear.dot_matches_new_line(true);
                fancy.dot_matches_new_line(true);
            }
            'x' => {
                linear.ignore_whitespace(true);
                fancy.ignore_whitespace(true);
            }
            // Unicode classes are both crates' default already.
            'u' => {}
            other => return Err(CompileError::Flag(other)),
        }
    }
    match linear.build() {
        Ok(re) => Ok(Pattern::Linear(re)),
        // Too big stays too big: the backtracking engine would delegate
        // the same program.
        Err(e @ regex::Error::CompiledTooBig(_)) => Err(CompileError::Syntax(e)),
        Err(e) if needs_backtracking(pattern, options) => fancy
            .build()
            .map(Pattern::Backtracking)
            .map_err(|_| CompileError::Syntax(e)),
        Err(e) => Err(CompileError::Syntax(e)),
    }
}

/// Whether the `regex` crate refuses `pattern` for what PCRE2 has and it
/// lacks (backreferences, look-around, escapes and group kinds such as
/// `\G`, `\Z`, `(?>…)`), and not for a mistake PCRE2 refuses as well (an
/// unclosed group, `a{3,1}`, a repeated group name): only then is the
/// backtracking engine tried, which accepts some of those mistakes. Only
/// the first error is seen: a pattern that needs backtracking *and* has
/// such a mistake after it (`(?=x)(?<n>a)(?<n>b)`) compiles, where PCRE2
/// refuses it.
fn needs_backtracking(pattern: &str, options: &str) -> bool {
    use regex_syntax::ast::ErrorKind as A;
    let parsed = regex_syntax::ast::parse::ParserBuilder::new()
        .ignore_whitespace(options.contains('x'))
        .build()
        .parse(pattern);
    matches!(
        parsed.map_err(|e| e.kind().clone()),
        Err(A::UnsupportedBackreference
            | A::UnsupportedLookAround
            | A::FlagUnrecognized
            | A::EscapeUnrecognized)
    )
}

impl Pattern {
    /// Whether `s` has a match.
    pub fn is_match(&self, s: &str) -> Result<bool, MatchError> {
        match self {
            Pattern::Linear(re) => Ok(re.is_match(s)),
            Pattern::Backtracking(re) => re.is_match(s).map_err(match_error),
        }
    }

    /// The first match's groups.
    pub fn captures(&self, s: &str) -> Result<Option<Groups>, MatchError> {
        match self {
            Pattern::Linear(re) => Ok(re.captures(s).map(|c| linear_groups(&c))),
            Pattern::Backtracking(re) => re
                .captures(s)
                .map(|c| c.map(|c| fancy_groups(&c)))
                .map_err(match_error),
        }
    }

    /// Every non-overlapping match's groups, left to right; `each` may stop
    /// the walk with an error of its own.
    pub fn each_captures<E>(
        &self,
        s: &str,
        mut each: impl FnMut(Groups) -> Result<(), E>,
    ) -> Result<(), EachError<E>> {
        match self {
            Pattern::Linear(re) => {
                for c in re.captures_iter(s) {
                    each(linear_groups(&c)).map_err(EachError::Caller)?;
                }
            }
            Pattern::Backtracking(re) => {
                for c in re.captures_iter(s) {
                    let c = c.map_err(|e| EachError::Match(match_error(e)))?;
                    each(fancy_groups(&c)).map_err(EachError::Caller)?;
                }
            }
        }
        Ok(())
    }
}

/// Why [`Pattern::each_captures`] stopped.
pub enum EachError<E> {
    Match(MatchError),
    Caller(E),
}

fn linear_groups(c: &regex::Captures<'_>) -> Groups {
    c.iter().map(|m| m.map(|m| (m.start(), m.end()))).collect()
}

fn fancy_groups(c: &fancy_regex::Captures<'_, str>) -> Groups {
    c.iter().map(|m| m.map(|m| (m.start(), m.end()))).collect()
}

fn match_error(e: fancy_regex::Error) -> MatchError {
    MatchError(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yes(p: &str, o: &str, s: &str) -> bool {
        compile(p, o)
            .expect("compiles")
            .is_match(s)
            .expect("matches")
    }

    #[test]
    fn plain_patterns_stay_on_the_linear_engine() {
        assert!(matches!(compile("^ab+c$", "i"), Ok(Pattern::Linear(_))));
        assert!(yes("^ab+c$", "i", "ABBC"));
    }

    #[test]
    fn backreferences_and_look_around_match_as_pcre() {
        assert!(matches!(
            compile(r"(\w)\1", ""),
            Ok(Pattern::Backtracking(_))
        ));
        assert!(yes(r"(\w)\1", "", "hello"));
        assert!(!yes(r"(\w)\1", "", "helo"));
        // A password rule: a digit somewhere, at least 8 characters.
        assert!(yes(r"^(?=.*\d).{8,}$", "", "abcdefg1"));
        assert!(!yes(r"^(?=.*\d).{8,}$", "", "abcdefgh"));
        assert!(yes(r"foo(?!bar)", "", "foobaz"));
        assert!(!yes(r"foo(?!bar)", "", "foobar"));
        assert!(yes(r"(?<=\$)\d+", "", "cost $42"));
        assert!(!yes(r"(?<!\$)\b\d+", "", "$42"));
        // Options reach the backtracking engine too.
        assert!(yes(r"^(?=A)a$", "i", "a"));
        assert!(yes(r"^(?=a).$", "s", "a"));
        assert!(yes(r"(?=b)^b", "m", "a\nb"));
    }

    #[test]
    fn groups_of_a_backtracking_match() {
        let p = compile(r"(\d)\1(x)?", "").expect("compiles");
        let g = p.captures("a11x").expect("ok").expect("match");
        assert_eq!(g, vec![Some((1, 4)), Some((1, 2)), Some((3, 4))]);
        let g = p.captures("a11").expect("ok").expect("match");
        assert_eq!(g, vec![Some((1, 3)), Some((1, 2)), None]);
        let mut all = Vec::new();
        let r: Result<(), EachError<()>> = p.each_captures("11 22 3", |g| {
            all.push(g[0]);
            Ok(())
        });
        assert!(r.is_ok());
        assert_eq!(all, vec![Some((0, 2)), Some((3, 5))]);
    }

    #[test]
    fn a_runaway_backtracking_match_is_bounded() {
        // Catastrophic backtracking: the backreference forces the slow engine.
        let p = compile(r"^(?:(a)|a)+\1b$", "").expect("compiles");
        let s = format!("{}cb", "a".repeat(64));
        assert!(p.is_match(&s).is_err());
    }

    #[test]
    fn what_neither_engine_accepts_is_a_syntax_error() {
        assert!(matches!(compile("(ab", ""), Err(CompileError::Syntax(_))));
        assert!(matches!(compile("a", "q"), Err(CompileError::Flag('q'))));
        let huge = r"(?:\w{1000}){1000}";
        assert!(matches!(compile(huge, ""), Err(CompileError::Syntax(_))));
        // Mistakes PCRE2 refuses stay refused, though the backtracking
        // engine would take them.
        for p in [r"a{3,1}", r"(?<1a>x)", r"(?<n>a)(?<n>b)"] {
            assert!(
                matches!(compile(p, ""), Err(CompileError::Syntax(_))),
                "{p}"
            );
        }
        // What PCRE2 has beyond look-around and backreferences.
        for p in [r"(?>a+)b", r"\Ga", r"a\Z"] {
            assert!(
                matches!(compile(p, ""), Ok(Pattern::Backtracking(_))),
                "{p}"
            );
        }
    }
}
