//! Reading PTX text: module header, kernel entries, their parameters and shared memory.
//!
//! This is not a PTX assembler: it tokenizes the text (comments and strings removed),
//! reads the module directives `.version`, `.target` and `.address_size`, and walks the
//! module-level declarations. Each `.entry` definition becomes a [`PtxEntry`] with its
//! parameter list; `.func` definitions are not entries but are followed through calls
//! when deciding which shared variables an entry uses.
//!
//! Shared memory accounting:
//! * [`PtxEntry::uses_dynamic_shared`]: the module declares an `.extern .shared` variable
//!   (dynamic shared memory, e.g. rustc's `gpu_launch_sized_workgroup_mem`) and the entry
//!   body, or a `.func` it calls (transitively), names it.
//! * [`PtxEntry::static_shared_bytes`]: the sum of the declared sizes of the non-extern
//!   `.shared` variables declared inside the entry body, plus those declared at module
//!   level that the entry (or a `.func` it calls) names. Alignment padding between them
//!   is not counted.
//!
//! Input without a `.version` or `.target` directive (text that is not PTX at all) is
//! rejected with [`PtxError::MissingDirective`] rather than returning an empty module.

use std::collections::{BTreeSet, HashMap, HashSet};

/// A parsed PTX module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxModule {
    /// PTX ISA version: `.version 7.0` gives `"7.0"`.
    pub version: String,
    /// First target of `.target`, e.g. `"sm_80"` (further items such as `debug` or
    /// `texmode_independent` are dropped).
    pub target: String,
    /// `.address_size` (32 or 64); 32 when the directive is absent, as the PTX ISA says.
    pub address_size: u32,
    /// Kernel entries (`.entry` definitions), in file order.
    pub entries: Vec<PtxEntry>,
}

impl PtxModule {
    /// The entry named `name`, if any.
    pub fn entry(&self, name: &str) -> Option<&PtxEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// One kernel entry point: an `.entry NAME(...) { ... }` definition (normally
/// `.visible`; `.weak` or unmarked entries are listed too, `.extern` declarations and
/// `.func` definitions are not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxEntry {
    /// Entry name (the launch symbol).
    pub name: String,
    /// Kernel parameters, in order.
    pub params: Vec<PtxParam>,
    /// The entry uses dynamic shared memory: it (or a function it calls) names an
    /// `.extern .shared` variable of the module.
    pub uses_dynamic_shared: bool,
    /// Bytes of static shared memory: non-extern `.shared` variables declared in the entry
    /// body, plus module-level ones the entry (or a function it calls) names.
    pub static_shared_bytes: u64,
}

/// One `.param` of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxParam {
    /// Parameter name, e.g. `"saxpy_param_0"`.
    pub name: String,
    /// Element type without the dot: `"u64"`, `"f32"`, `"b32"`, `"b8"` (for byte arrays)...
    pub ty: String,
    /// Size in bytes: element size times the array length(s), e.g. 16 for `.b8 p[16]`.
    pub size: u32,
    /// The parameter carries the `.ptr` attribute (a pointer into some state space).
    pub is_ptr: bool,
    /// `.align N`, when given.
    pub align: Option<u32>,
}

/// Why PTX text could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    /// A required module directive is absent; this is what text that is not PTX gives.
    #[error("not a PTX module: no `{0}` directive found")]
    MissingDirective(&'static str),
    /// A module directive has an unusable value.
    #[error("line {line}: bad `{directive}` directive: {message}")]
    BadDirective {
        /// The directive, e.g. `.address_size`.
        directive: &'static str,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The text ended inside a construct.
    #[error("unexpected end of PTX: unterminated {0}")]
    UnexpectedEof(String),
    /// A closing bracket does not match the opening one.
    #[error("line {line}: unbalanced `{found}` in PTX")]
    Unbalanced {
        /// The offending character.
        found: char,
        /// 1-based line.
        line: usize,
    },
    /// An entry declaration could not be read.
    #[error("line {line}: malformed `.entry` declaration: {message}")]
    BadEntry {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A parameter of an entry could not be read.
    #[error("line {line}: entry `{entry}`: cannot read parameter `{param}`: {message}")]
    BadParam {
        /// The entry.
        entry: String,
        /// The parameter text as written.
        param: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// Parses PTX text (as written by LLVM's NVPTX back end or `nvcc -ptx`).
///
/// Returns the module header and every `.entry` definition; `.func` definitions and
/// declarations (`.extern`) are not entries. Text without `.version`/`.target` gives
/// [`PtxError::MissingDirective`]; unterminated comments/strings/brackets give
/// [`PtxError::UnexpectedEof`] or [`PtxError::Unbalanced`]; unknown parameter types give
/// [`PtxError::BadParam`].
pub fn parse_ptx(text: &str) -> Result<PtxModule, PtxError> {
    let tokens = tokenize(text)?;
    Parser { toks: &tokens, pos: 0 }.module()
}

// ---------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// Identifiers, directives (leading '.'), numbers, opcodes with dots, registers.
    Word(String),
    /// A single punctuation character.
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

impl Token {
    fn word(&self) -> Option<&str> {
        match &self.tok {
            Tok::Word(w) => Some(w),
            Tok::Punct(_) => None,
        }
    }
    fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%' | '.')
}

fn tokenize(text: &str) -> Result<Vec<Token>, PtxError> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    let mut line = 1usize;
    while let Some((start, c)) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '/' if chars.peek().map(|p| p.1) == Some('/') => {
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            '/' if chars.peek().map(|p| p.1) == Some('*') => {
                chars.next();
                let mut prev = '\0';
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                    }
                    if prev == '*' && c == '/' {
                        closed = true;
                        break;
                    }
                    prev = c;
                }
                if !closed {
                    return Err(PtxError::UnexpectedEof("/* comment".into()));
                }
            }
            '"' => {
                // Strings only appear in `.file`, `.pragma` and `.section` contents; drop them.
                let mut escaped = false;
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                    }
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err(PtxError::UnexpectedEof("string literal".into()));
                }
                out.push(Token {
                    tok: Tok::Word(String::new()),
                    line,
                });
            }
            c if is_word_char(c) => {
                let mut end = start + c.len_utf8();
                while let Some(&(i, n)) = chars.peek() {
                    if !is_word_char(n) {
                        break;
                    }
                    end = i + n.len_utf8();
                    chars.next();
                }
                out.push(Token {
                    tok: Tok::Word(text[start..end].to_string()),
                    line,
                });
            }
            c => out.push(Token {
                tok: Tok::Punct(c),
                line,
            }),
        }
    }
    Ok(out)
}

/// Splits `.ptr.global.align` into `.ptr`, `.global`, `.align`.
fn split_directives(word: &str) -> impl Iterator<Item = &str> + '_ {
    word.match_indices('.').map(move |(i, _)| {
        let rest = &word[i..];
        let end = rest[1..].find('.').map(|j| j + 1).unwrap_or(rest.len());
        &rest[..end]
    })
}

// ---------------------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------------------

struct Parser<'t> {
    toks: &'t [Token],
    pos: usize,
}

/// A `.func` or `.entry` body: names it mentions and shared variables it declares.
#[derive(Default)]
struct Body {
    names: HashSet<String>,
    static_shared: u64,
}

struct RawEntry {
    name: String,
    params: Vec<PtxParam>,
    body: Body,
}

impl<'t> Parser<'t> {
    fn peek(&self) -> Option<&'t Token> {
        self.toks.get(self.pos)
    }

    fn next(&mut self) -> Option<&'t Token> {
        let t = self.toks.get(self.pos);
        self.pos += 1;
        t
    }

    fn module(mut self) -> Result<PtxModule, PtxError> {
        let mut version = None;
        let mut target = None;
        let mut address_size = None;
        let mut extern_shared: HashSet<String> = HashSet::new();
        let mut module_shared: HashMap<String, u64> = HashMap::new();
        let mut funcs: HashMap<String, Body> = HashMap::new();
        let mut entries: Vec<RawEntry> = Vec::new();

        while let Some(tok) = self.peek() {
            match tok.word() {
                Some(".version") => {
                    self.next();
                    let v = self.expect_word(".version", tok.line)?;
                    if !v.chars().all(|c| c.is_ascii_digit() || c == '.') || v.is_empty() {
                        return Err(PtxError::BadDirective {
                            directive: ".version",
                            line: tok.line,
                            message: format!("expected MAJOR.MINOR, found {v:?}"),
                        });
                    }
                    version = Some(v.to_string());
                }
                Some(".target") => {
                    self.next();
                    let t = self.expect_word(".target", tok.line)?;
                    target = Some(t.to_string());
                    while self.peek().is_some_and(|t| t.is(',')) {
                        self.next();
                        self.expect_word(".target", tok.line)?;
                    }
                }
                Some(".address_size") => {
                    self.next();
                    let v = self.expect_word(".address_size", tok.line)?;
                    let n = v.parse::<u32>().ok().filter(|n| *n == 32 || *n == 64).ok_or_else(|| {
                        PtxError::BadDirective {
                            directive: ".address_size",
                            line: tok.line,
                            message: format!("expected 32 or 64, found {v:?}"),
                        }
                    })?;
                    address_size = Some(n);
                }
                Some(".file") => {
                    // `.file N "name" [, timestamp, size]`
                    self.next();
                    while let Some(t) = self.peek() {
                        if t.is(',') || (t.word().is_some_and(|w| !w.starts_with('.')) && t.line == tok.line) {
                            self.next();
                        } else {
                            break;
                        }
                    }
                }
                Some(".section") => {
                    // Debug sections: `.section .debug_info { ... }`.
                    self.next();
                    while let Some(t) = self.peek() {
                        if t.is('{') {
                            break;
                        }
                        self.next();
                    }
                    if self.peek().is_some() {
                        self.skip_balanced()?;
                    }
                }
                _ => self.declaration(&mut extern_shared, &mut module_shared, &mut funcs, &mut entries)?,
            }
        }

        let version = version.ok_or(PtxError::MissingDirective(".version"))?;
        let target = target.ok_or(PtxError::MissingDirective(".target"))?;

        let entries = entries
            .into_iter()
            .map(|e| {
                let names = reachable_names(&e.body, &funcs);
                let uses_dynamic_shared = extern_shared.iter().any(|s| names.contains(s.as_str()));
                let module_static: u64 = module_shared
                    .iter()
                    .filter(|(n, _)| names.contains(n.as_str()))
                    .map(|(_, s)| *s)
                    .sum();
                let called_static: u64 = names
                    .iter()
                    .filter_map(|n| funcs.get(*n))
                    .map(|b| b.static_shared)
                    .sum();
                PtxEntry {
                    name: e.name,
                    params: e.params,
                    uses_dynamic_shared,
                    static_shared_bytes: e.body.static_shared + module_static + called_static,
                }
            })
            .collect();

        Ok(PtxModule {
            version,
            target,
            address_size: address_size.unwrap_or(32),
            entries,
        })
    }

    fn expect_word(&mut self, directive: &'static str, line: usize) -> Result<&'t str, PtxError> {
        match self.next() {
            Some(t) if t.word().is_some_and(|w| !w.is_empty()) => Ok(t.word().unwrap_or_default()),
            Some(t) => Err(PtxError::BadDirective {
                directive,
                line: t.line,
                message: format!("expected a value, found {:?}", t.tok),
            }),
            None => Err(PtxError::BadDirective {
                directive,
                line,
                message: "missing value".into(),
            }),
        }
    }

    /// Skips a balanced `{...}`, `(...)` or `[...]` group starting at the current token.
    fn skip_balanced(&mut self) -> Result<(), PtxError> {
        let start = self.peek().map(|t| t.line).unwrap_or(1);
        let mut stack = Vec::new();
        while let Some(t) = self.next() {
            if let Tok::Punct(c) = t.tok {
                match c {
                    '{' | '(' | '[' => stack.push(c),
                    '}' | ')' | ']' => {
                        let open = match c {
                            '}' => '{',
                            ')' => '(',
                            _ => '[',
                        };
                        if stack.pop() != Some(open) {
                            return Err(PtxError::Unbalanced { found: c, line: t.line });
                        }
                    }
                    _ => {}
                }
            }
            if stack.is_empty() {
                return Ok(());
            }
        }
        Err(PtxError::UnexpectedEof(format!("bracket group opened on line {start}")))
    }

    /// One module-level declaration: up to `;` or through a function body.
    fn declaration(
        &mut self,
        extern_shared: &mut HashSet<String>,
        module_shared: &mut HashMap<String, u64>,
        funcs: &mut HashMap<String, Body>,
        entries: &mut Vec<RawEntry>,
    ) -> Result<(), PtxError> {
        let start = self.pos;
        let line = self.peek().map(|t| t.line).unwrap_or(1);
        let mut saw_eq = false;
        // Collect the header: tokens up to `;` or a body `{` at depth 0 (or the end of the
        // text: trailing junk without `;` ends the declaration).
        while let Some(t) = self.peek() {
            match t.tok {
                Tok::Punct(';') => {
                    self.next();
                    break;
                }
                Tok::Punct('=') => {
                    saw_eq = true;
                    self.next();
                }
                Tok::Punct('{') if !saw_eq => break,
                Tok::Punct('{' | '(' | '[') => self.skip_balanced()?,
                Tok::Punct(c @ ('}' | ')' | ']')) => return Err(PtxError::Unbalanced { found: c, line: t.line }),
                _ => {
                    self.next();
                }
            }
        }
        let header = &self.toks[start..self.pos];
        let has_body = self.peek().is_some_and(|t| t.is('{')) && !header.last().is_some_and(|t| t.is(';'));
        let words: Vec<&str> = header.iter().filter_map(Token::word).collect();
        let is_entry = words.contains(&".entry");
        let is_func = words.contains(&".func");
        let is_extern = words.contains(&".extern");

        if !is_entry && !is_func {
            if has_body {
                // A stray `{` block at module level: skip it.
                self.skip_balanced()?;
                return Ok(());
            }
            if words.contains(&".shared") {
                if let Some((name, size)) = variable(header) {
                    if is_extern {
                        extern_shared.insert(name);
                    } else {
                        module_shared.insert(name, size);
                    }
                }
            }
            return Ok(());
        }

        let body = if has_body { Some(self.body()?) } else { None };
        if is_entry {
            if is_extern {
                return Ok(());
            }
            let Some(body) = body else {
                // A prototype without a body declares nothing launchable.
                return Ok(());
            };
            let (name, params) = entry_signature(header, line)?;
            entries.push(RawEntry { name, params, body });
        } else if let (Some(body), Some(name)) = (body, func_name(header)) {
            funcs.insert(name, body);
        }
        Ok(())
    }

    /// Reads a `{ ... }` body: every word it mentions and its `.shared` declarations.
    fn body(&mut self) -> Result<Body, PtxError> {
        let start = self.pos;
        self.skip_balanced()?;
        let toks = &self.toks[start + 1..self.pos - 1];
        let mut body = Body::default();
        let mut stmt_start = 0;
        for (i, t) in toks.iter().enumerate() {
            match &t.tok {
                Tok::Word(w) if !w.starts_with('.') && !w.starts_with('%') && !w.is_empty() => {
                    body.names.insert(w.clone());
                }
                Tok::Punct(';') => {
                    let stmt = &toks[stmt_start..i];
                    if stmt.iter().any(|t| t.word() == Some(".shared"))
                        && !stmt.iter().any(|t| t.word() == Some(".extern"))
                        && stmt.first().and_then(Token::word).is_some_and(|w| w.starts_with('.'))
                    {
                        if let Some((_, size)) = variable(stmt) {
                            body.static_shared += size;
                        }
                    }
                    stmt_start = i + 1;
                }
                Tok::Punct('{' | '}' | ':') => stmt_start = i + 1,
                _ => {}
            }
        }
        Ok(body)
    }
}

/// Names mentioned by an entry body and, transitively, by the `.func` bodies it names.
fn reachable_names<'a>(body: &'a Body, funcs: &'a HashMap<String, Body>) -> BTreeSet<&'a str> {
    let mut seen: BTreeSet<&str> = body.names.iter().map(String::as_str).collect();
    let mut work: Vec<&str> = seen.iter().copied().filter(|n| funcs.contains_key(*n)).collect();
    while let Some(f) = work.pop() {
        if let Some(b) = funcs.get(f) {
            for n in &b.names {
                if seen.insert(n.as_str()) && funcs.contains_key(n.as_str()) {
                    work.push(n.as_str());
                }
            }
        }
    }
    seen
}

/// Name and byte size of a variable declaration like
/// `.shared .align 4 .b8 buf[1024]` or `.extern .shared .align 4 .b8 dyn[]`.
/// The size is 0 for unsized arrays and unknown types.
fn variable(toks: &[Token]) -> Option<(String, u64)> {
    let mut ty_size: Option<u64> = None;
    let mut name: Option<String> = None;
    let mut dims: Vec<u64> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        match &t.tok {
            Tok::Word(w) if w.starts_with('.') => {
                for d in split_directives(w) {
                    if let Some(s) = type_size(&d[1..]) {
                        ty_size = Some(u64::from(s));
                    }
                }
                if w == ".align" {
                    i += 1; // skip the alignment value
                }
            }
            Tok::Word(w) if name.is_none() && !w.is_empty() => name = Some(w.clone()),
            Tok::Punct('[') if name.is_some() => {
                let n = toks.get(i + 1).and_then(Token::word).and_then(parse_int);
                dims.push(n.unwrap_or(0));
            }
            Tok::Punct('=') => break,
            _ => {}
        }
        i += 1;
    }
    let size = ty_size.unwrap_or(0) * dims.iter().product::<u64>();
    name.map(|n| (n, size))
}

fn parse_int(w: &str) -> Option<u64> {
    if let Some(hex) = w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
        u64::from_str_radix(hex.trim_end_matches(['U', 'u']), 16).ok()
    } else {
        w.trim_end_matches(['U', 'u']).parse().ok()
    }
}

/// Byte size of a PTX fundamental type name (without the dot).
fn type_size(ty: &str) -> Option<u32> {
    Some(match ty {
        "pred" | "b8" | "u8" | "s8" | "e4m3" | "e5m2" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" | "e4m3x2" | "e5m2x2" => 2,
        "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" | "tf32" => 4,
        "b64" | "u64" | "s64" | "f64" => 8,
        "b128" => 16,
        // Opaque handles are 64-bit.
        "texref" | "samplerref" | "surfref" => 8,
        _ => return None,
    })
}

/// The name of a `.func` header: the word before the parameter list, skipping an optional
/// `( .param ... )` return list.
fn func_name(header: &[Token]) -> Option<String> {
    let start = header.iter().position(|t| t.word() == Some(".func"))? + 1;
    let mut i = start;
    if header.get(i).is_some_and(|t| t.is('(')) {
        i = close_paren(header, i)? + 1;
    }
    header
        .get(i)
        .and_then(Token::word)
        .filter(|w| !w.starts_with('.'))
        .map(str::to_string)
}

/// Index of the `)` matching the `(` at `open`.
fn close_paren(toks: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        if t.is('(') {
            depth += 1;
        } else if t.is(')') {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// Name and parameters of an `.entry NAME ( params ) [performance directives]` header.
fn entry_signature(header: &[Token], line: usize) -> Result<(String, Vec<PtxParam>), PtxError> {
    let at = header.iter().position(|t| t.word() == Some(".entry")).unwrap_or(0);
    let name = header
        .get(at + 1)
        .and_then(Token::word)
        .filter(|w| !w.starts_with('.') && !w.is_empty())
        .ok_or_else(|| PtxError::BadEntry {
            line,
            message: "no name after `.entry`".into(),
        })?
        .to_string();
    let mut params = Vec::new();
    if header.get(at + 2).is_some_and(|t| t.is('(')) {
        let close = close_paren(header, at + 2).ok_or_else(|| PtxError::BadEntry {
            line,
            message: format!("`{name}`: unclosed parameter list"),
        })?;
        let inner = &header[at + 3..close];
        for chunk in inner.split(|t| t.is(',')) {
            if chunk.is_empty() {
                continue;
            }
            params.push(param(&name, chunk)?);
        }
    }
    Ok((name, params))
}

/// One `.param [.align N] .TYPE [.ptr [.SPACE] [.align N]] NAME[[N]...]`.
fn param(entry: &str, toks: &[Token]) -> Result<PtxParam, PtxError> {
    let line = toks.first().map(|t| t.line).unwrap_or(0);
    let text = toks
        .iter()
        .map(|t| match &t.tok {
            Tok::Word(w) => w.clone(),
            Tok::Punct(c) => c.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ");
    let err = |message: String| PtxError::BadParam {
        entry: entry.to_string(),
        param: text.clone(),
        line,
        message,
    };

    let mut ty: Option<(String, u32)> = None;
    let mut is_ptr = false;
    let mut align = None;
    let mut name: Option<String> = None;
    let mut dims: Vec<u32> = Vec::new();
    let mut saw_param = false;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Word(w) if w.starts_with('.') => {
                if name.is_some() {
                    return Err(err(format!("unexpected `{w}` after the name")));
                }
                let parts: Vec<&str> = split_directives(w).collect();
                for d in &parts {
                    match *d {
                        ".param" => saw_param = true,
                        ".ptr" => is_ptr = true,
                        ".align" => {}
                        ".global" | ".const" | ".local" | ".shared" => {}
                        d => match type_size(&d[1..]) {
                            Some(s) if ty.is_none() => ty = Some((d[1..].to_string(), s)),
                            Some(_) => return Err(err(format!("second type `{d}`"))),
                            None => return Err(err(format!("unknown type or attribute `{d}`"))),
                        },
                    }
                }
                if parts.last() == Some(&".align") {
                    let v = toks.get(i + 1).and_then(Token::word).and_then(parse_int);
                    let v = v
                        .and_then(|v| u32::try_from(v).ok())
                        .filter(|v| v.is_power_of_two())
                        .ok_or_else(|| err("`.align` needs a power-of-two value".into()))?;
                    align = Some(v);
                    i += 1;
                }
            }
            Tok::Word(w) if !w.is_empty() => {
                if name.is_some() {
                    return Err(err(format!("unexpected `{w}`")));
                }
                name = Some(w.clone());
            }
            Tok::Punct('[') => {
                if name.is_none() {
                    return Err(err("array bound before the name".into()));
                }
                let n = toks
                    .get(i + 1)
                    .and_then(Token::word)
                    .and_then(parse_int)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| err("array parameters need a constant size".into()))?;
                if !toks.get(i + 2).is_some_and(|t| t.is(']')) {
                    return Err(err("expected `]`".into()));
                }
                dims.push(n);
                i += 2;
            }
            other => return Err(err(format!("unexpected {other:?}"))),
        }
        i += 1;
    }
    if !saw_param {
        return Err(err("expected `.param`".into()));
    }
    let (ty, elem) = ty.ok_or_else(|| err("no type".into()))?;
    let name = name.ok_or_else(|| err("no name".into()))?;
    let size = dims
        .iter()
        .try_fold(elem, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| err("size overflows".into()))?;
    Ok(PtxParam {
        name,
        ty,
        size,
        is_ptr,
        align,
    })
}

/// `text` with a `.maxntid max, 1, 1` directive on every `.entry`, between the parameter
/// list and the body, where `max = max_threads(entry name)`; a `.maxntid` already there
/// is replaced (a cached PTX file carries the bound of the build that wrote it, and a
/// changed `max_threads` alone leaves the compiled code as it was). Idempotent.
pub fn with_max_threads(text: &str, max_threads: impl Fn(&str) -> u32) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut entry: Option<u32> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(".visible .entry ").or_else(|| t.strip_prefix(".entry ")) {
            let name = rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or("");
            entry = Some(max_threads(name));
        }
        if entry.is_some() && t.starts_with(".maxntid") {
            continue;
        }
        if let (Some(max), true) = (entry, t.starts_with('{')) {
            out.push_str(&format!(".maxntid {max}, 1, 1\n"));
            entry = None;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `text` without the `.entry` definitions whose names `keep` rejects (each from its
/// `.entry` line through the `}` line that closes its body); everything else as it was.
/// For PTX variants that only some kernels launch from: the driver compiles every entry of
/// a module when it loads it.
pub fn retain_entries(text: &str, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut dropping = false;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(".visible .entry ").or_else(|| t.strip_prefix(".entry ")) {
            let name = rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or("");
            dropping = !keep(name);
        }
        if !dropping {
            out.push_str(line);
            out.push('\n');
        } else if line == "}" {
            dropping = false;
        }
    }
    out
}

#[cfg(test)]
mod retain_tests {
    use super::{parse_ptx, retain_entries};

    #[test]
    fn drops_only_the_rejected_entries() {
        let ptx = ".version 8.0\n.target sm_90a\n.func f()\n{\n\tret;\n}\n.visible .entry a(\n\t.param .u64 a_0\n)\n{\n\t{\n\tret;\n\t}\n}\n.visible .entry b()\n{\n\tret;\n}\n";
        let kept = retain_entries(ptx, |n| n == "b");
        let m = parse_ptx(&kept).unwrap();
        assert_eq!(m.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b"]);
        assert!(kept.contains(".func f()") && kept.ends_with("{\n\tret;\n}\n"), "{kept}");
        assert_eq!(retain_entries(ptx, |_| true), ptx);
    }
}

#[cfg(test)]
mod max_threads_tests {
    use super::with_max_threads;

    #[test]
    fn adds_maxntid_once_per_entry() {
        let ptx = ".version 7.0\n.target sm_80\n.visible .entry a(\n\t.param .u64 a_0\n)\n{\n\tret;\n}\n.visible .entry b()\n{\n\tret;\n}\n";
        let bound = |name: &str| if name == "b" { 256 } else { 1024 };
        let once = with_max_threads(ptx, bound);
        assert_eq!(once.matches(".maxntid").count(), 2, "{once}");
        assert!(once.contains(")\n.maxntid 1024, 1, 1\n{"), "{once}");
        assert!(once.contains(".entry b()\n.maxntid 256, 1, 1\n{"), "{once}");
        assert_eq!(with_max_threads(&once, bound), once, "idempotent");
        // A changed bound replaces the old directive.
        let again = with_max_threads(&once, |_| 512);
        assert_eq!(again.matches(".maxntid").count(), 2, "{again}");
        assert_eq!(again.matches(".maxntid 512, 1, 1").count(), 2, "{again}");
    }
}
