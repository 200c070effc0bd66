//! Bounds on what a schema or grammar may ask of the compiler, checked before it runs.
//!
//! llguidance compiles JSON schemas and Lark grammars recursively: every level of nesting,
//! every `$ref` followed and every rule a rule refers to takes a few kilobytes of stack. A
//! request of a few kilobytes (a chain of 300 `$ref`s, of 700 rules) would overflow any thread
//! stack. So before any recursive work, [`check`] walks the spec with explicit stacks (no
//! recursion on untrusted input) and refuses, naming the limit and where it was passed:
//!
//! - a JSON schema deeper than [`MAX_SCHEMA_DEPTH`] levels, counting the JSON nesting and
//!   every `$ref` followed to its target (a reference back into what is being walked, a
//!   recursive schema, adds nothing: the compiler does not unfold it);
//! - an `anyOf`, `oneOf` or `allOf` of more than [`MAX_SCHEMA_ALTERNATIVES`] schemas;
//! - more than [`MAX_SCHEMA_NODES`] objects and arrays in one schema;
//! - a grammar whose rules chain (a rule referring to a rule, nested groups) deeper than
//!   [`MAX_GRAMMAR_DEPTH`], or with more than [`MAX_GRAMMAR_RULES`] rules; the JSON schemas a
//!   Lark grammar embeds (`%json { ... }`) are checked as schemas;
//! - a Lark grammar this check cannot read as llguidance would (a string or regex literal
//!   that does not end on its line, a `%json` block that does not parse): "cannot check".
//!
//! A GBNF grammar's rules are counted (its `::=`) before it is translated. Paths in messages
//! are cut: each segment to 64 bytes.
//!
//! What passes is then compiled on a thread of its own with a [`COMPILE_STACK`] stack
//! ([`on_compile_stack`]), many times what the limits need (a unit test compiles specs at
//! every limit on an eighth of it).

use std::collections::HashMap;

use serde_json::Value;

use super::{GrammarError, GrammarSpec};

/// Deepest JSON schema: levels of nesting plus `$ref`s followed.
pub const MAX_SCHEMA_DEPTH: usize = 256;
/// Widest `anyOf` / `oneOf` / `allOf`.
pub const MAX_SCHEMA_ALTERNATIVES: usize = 1024;
/// Most objects and arrays in one schema.
pub const MAX_SCHEMA_NODES: usize = 65_536;
/// Deepest chain of grammar rules (and nested groups).
pub const MAX_GRAMMAR_DEPTH: usize = 256;
/// Most rules in one grammar.
pub const MAX_GRAMMAR_RULES: usize = 16_384;
/// The stack of a compile thread.
pub const COMPILE_STACK: usize = 64 << 20;

/// Refuse `spec` if it passes a limit (before anything recursive touches it).
pub fn check(spec: &GrammarSpec) -> Result<(), GrammarError> {
    match spec {
        GrammarSpec::JsonSchema(s) => check_schema(s),
        GrammarSpec::JsonObject => Ok(()),
        GrammarSpec::Gbnf(g) => {
            // Counted before the translation, whose work grows with the rules: every rule has
            // a `::=` (one in a literal or comment only makes the count larger).
            let defs = g.matches("::=").count();
            if defs > MAX_GRAMMAR_RULES {
                return Err(limit(
                    "grammar".into(),
                    format!(
                        "the grammar has {defs} rules (`::=`); at most {MAX_GRAMMAR_RULES} are allowed"
                    ),
                ));
            }
            check_lark(&super::gbnf::gbnf_to_lark(g)?)
        }
        GrammarSpec::Lark(g) => check_lark(g),
    }
}

/// Run `f` on a fresh thread with a [`COMPILE_STACK`] stack and wait for it. A panic in `f`
/// comes back as an error (the process goes on).
pub fn on_compile_stack<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, GrammarError> {
    let h = std::thread::Builder::new()
        .name("kiln-grammar".into())
        .stack_size(COMPILE_STACK)
        .spawn(f)
        .map_err(|e| GrammarError::Matcher(format!("cannot start a compile thread: {e}")))?;
    h.join()
        .map_err(|_| GrammarError::Matcher("the grammar compiler panicked".into()))
}

fn limit(at: String, msg: String) -> GrammarError {
    GrammarError::Limit { at, msg }
}

/// The node a `$ref` names in `root` (`#`, `#/json/pointer`, `#anchor`, an `$id` with an
/// optional `#/pointer` fragment), or `None` if it names nothing in this document.
fn resolve<'a>(root: &'a Value, ids: &HashMap<&str, &'a Value>, r: &str) -> Option<&'a Value> {
    let (base, frag) = match r.split_once('#') {
        Some((b, f)) => (b, f),
        None => (r, ""),
    };
    let doc = if base.is_empty() {
        root
    } else {
        ids.get(base).copied()?
    };
    if frag.is_empty() {
        return Some(doc);
    }
    if !frag.starts_with('/') {
        return ids.get(format!("#{frag}").as_str()).copied();
    }
    let mut node = doc;
    for part in frag[1..].split('/') {
        // A URI fragment: percent-decoded first, then the pointer's own escapes (RFC 6901 §6).
        let part = percent_encoding::percent_decode_str(part).decode_utf8_lossy();
        let part = part.replace("~1", "/").replace("~0", "~");
        node = match node {
            Value::Object(m) => m.get(&part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(node)
}

/// One step of a path into a schema, kept in an arena ([`Path`]) so that the walk carries
/// indices, not strings; the text is built only when a limit is passed.
#[derive(Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Idx(usize),
    Ref(&'a str),
}

/// Longest piece of one path segment in a message (longer ones are cut, `…` marking the cut).
const SEG_SHOWN: usize = 64;
/// Longest path in a message.
const PATH_SHOWN: usize = 4096;

/// The paths of the nodes walked: each entry its parent's index (`u32::MAX` for the root) and
/// its last segment.
struct Path<'a> {
    nodes: Vec<(u32, Seg<'a>)>,
}

const NO_PARENT: u32 = u32::MAX;

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl<'a> Path<'a> {
    fn new() -> Self {
        Path { nodes: Vec::new() }
    }

    fn push(&mut self, parent: u32, seg: Seg<'a>) -> u32 {
        self.nodes.push((parent, seg));
        // At most MAX_SCHEMA_NODES + 1 entries per pass of the walk, and two passes, so this
        // stays far below `u32::MAX`.
        (self.nodes.len() - 1) as u32
    }

    /// The JSON pointer of entry `at` (`""` for the root), each segment cut to
    /// [`SEG_SHOWN`] bytes and the whole to [`PATH_SHOWN`].
    fn text(&self, at: u32) -> String {
        let mut segs = Vec::new();
        let mut i = at;
        while i != NO_PARENT {
            let Some(&(parent, seg)) = self.nodes.get(i as usize) else {
                break;
            };
            segs.push(seg);
            i = parent;
        }
        let mut out = String::new();
        for seg in segs.iter().rev() {
            if out.len() > PATH_SHOWN {
                out.push_str("/…");
                break;
            }
            out.push('/');
            match seg {
                Seg::Key(k) => {
                    out.push_str(&cut(k, SEG_SHOWN).replace('~', "~0").replace('/', "~1"))
                }
                Seg::Idx(i) => out.push_str(&i.to_string()),
                Seg::Ref(r) => {
                    out.push_str("$ref(");
                    out.push_str(&cut(r, SEG_SHOWN));
                    out.push(')');
                }
            }
        }
        out
    }
}

fn too_many_nodes() -> String {
    format!("the schema has more than {MAX_SCHEMA_NODES} objects and arrays")
}

/// Check a JSON schema's depth (nesting and `$ref`s followed), width and size.
pub fn check_schema(root: &Value) -> Result<(), GrammarError> {
    let mut path = Path::new();
    // Pass 1 (iterative): count the nodes (as they are found, so that a wide schema stops the
    // walk at the limit), check the widths, collect `$id`s and `$anchor`s.
    let mut ids: HashMap<&str, &Value> = HashMap::new();
    let mut todo: Vec<(&Value, u32)> = vec![(root, NO_PARENT)];
    let mut nodes = 1usize;
    while let Some((v, at)) = todo.pop() {
        match v {
            Value::Object(m) => {
                for key in ["anyOf", "oneOf", "allOf"] {
                    if let Some(Value::Array(a)) = m.get(key) {
                        if a.len() > MAX_SCHEMA_ALTERNATIVES {
                            let at = path.push(at, Seg::Key(key));
                            return Err(limit(
                                path.text(at),
                                format!(
                                    "{key} has {} schemas; at most {MAX_SCHEMA_ALTERNATIVES} are allowed",
                                    a.len()
                                ),
                            ));
                        }
                    }
                }
                if let Some(Value::String(id)) = m.get("$id") {
                    ids.insert(id.as_str(), v);
                }
                if let Some(Value::String(a)) = m.get("$anchor") {
                    ids.entry(a.as_str()).or_insert(v);
                    // Reached as `#name`.
                }
                for (k, c) in m {
                    if c.is_object() || c.is_array() {
                        let here = path.push(at, Seg::Key(k));
                        nodes += 1;
                        if nodes > MAX_SCHEMA_NODES {
                            return Err(limit(path.text(here), too_many_nodes()));
                        }
                        todo.push((c, here));
                    }
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    if c.is_object() || c.is_array() {
                        let here = path.push(at, Seg::Idx(i));
                        nodes += 1;
                        if nodes > MAX_SCHEMA_NODES {
                            return Err(limit(path.text(here), too_many_nodes()));
                        }
                        todo.push((c, here));
                    }
                }
            }
            _ => {}
        }
    }
    let anchors: Vec<(String, &Value)> = ids
        .iter()
        .filter(|(k, _)| !k.contains(':') && !k.contains('/') && !k.contains('#'))
        .map(|(k, v)| (format!("#{k}"), *v))
        .collect();
    let mut names: HashMap<String, &Value> = anchors.into_iter().collect();
    for (k, v) in &ids {
        names.entry((*k).to_string()).or_insert(*v);
    }
    let ids: HashMap<&str, &Value> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();

    // Pass 2 (iterative depth-first): the deepest path through nesting and `$ref`s, each node
    // measured once. A node's depth is one more than its deepest child's (its `$ref` target
    // counts as a child); a target still being walked (a recursive schema) counts nothing.
    // Paths again live in the arena: a frame holds its children as values and segments, and
    // a child's path entry is made only when the walk enters it.
    path.nodes.clear();
    let key = |v: &Value| v as *const Value as usize;
    let mut depth: HashMap<usize, usize> = HashMap::new();
    let mut on_path: HashMap<usize, ()> = HashMap::new();
    // A frame: the node, its path entry, its children, the next child to visit, the deepest
    // so far.
    struct Frame<'a> {
        node: &'a Value,
        at: u32,
        kids: Vec<(&'a Value, Seg<'a>)>,
        next: usize,
        deepest: usize,
    }
    fn kids<'a>(
        root: &'a Value,
        ids: &HashMap<&str, &'a Value>,
        v: &'a Value,
    ) -> Vec<(&'a Value, Seg<'a>)> {
        let mut out = Vec::new();
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    if c.is_object() || c.is_array() {
                        out.push((c, Seg::Key(k.as_str())));
                    }
                }
                if let Some(Value::String(r)) = m.get("$ref") {
                    if let Some(t) = resolve(root, ids, r) {
                        out.push((t, Seg::Ref(r.as_str())));
                    }
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    if c.is_object() || c.is_array() {
                        out.push((c, Seg::Idx(i)));
                    }
                }
            }
            _ => {}
        }
        out
    }
    let deep = || {
        format!(
            "the schema nests (counting each $ref followed) deeper than {MAX_SCHEMA_DEPTH} levels"
        )
    };
    let mut stack: Vec<Frame> = vec![Frame {
        node: root,
        at: NO_PARENT,
        kids: kids(root, &ids, root),
        next: 0,
        deepest: 0,
    }];
    on_path.insert(key(root), ());
    while let Some(top) = stack.last_mut() {
        if top.next < top.kids.len() {
            let (c, seg) = top.kids[top.next];
            let parent = top.at;
            top.next += 1;
            let k = key(c);
            if let Some(&d) = depth.get(&k) {
                top.deepest = top.deepest.max(d);
                continue;
            }
            if on_path.contains_key(&k) || !(c.is_object() || c.is_array()) {
                continue;
            }
            // Each node is entered once (then its depth is known), so the arena holds at most
            // one entry per node.
            let at = path.push(parent, seg);
            if stack.len() + 1 > MAX_SCHEMA_DEPTH {
                return Err(limit(path.text(at), deep()));
            }
            on_path.insert(k, ());
            let ks = kids(root, &ids, c);
            stack.push(Frame {
                node: c,
                at,
                kids: ks,
                next: 0,
                deepest: 0,
            });
        } else {
            let Some(done) = stack.pop() else { break };
            let d = done.deepest + 1;
            let k = key(done.node);
            on_path.remove(&k);
            depth.insert(k, d);
            if d > MAX_SCHEMA_DEPTH {
                return Err(limit(path.text(done.at), deep()));
            }
            if let Some(parent) = stack.last_mut() {
                parent.deepest = parent.deepest.max(d);
            }
        }
    }
    Ok(())
}

/// One rule of a Lark grammar as [`check_lark`] reads it: the rules it names, each with the
/// depth of groups it is named in, and its deepest group.
struct LarkRule<'a> {
    name: &'a str,
    refs: Vec<(&'a str, usize)>,
    groups: usize,
}

/// The length of the rule or token name at the start of `b` (0 if none), read as llguidance's
/// Lark lexer reads them: a rule `_?[a-z][_a-z0-9-]*`, a token `_?[A-Z][_A-Z0-9-]*`.
fn ident_len(b: &[u8]) -> usize {
    let mut n = usize::from(b.first() == Some(&b'_'));
    let lower = match b.get(n) {
        Some(c) if c.is_ascii_lowercase() => true,
        Some(c) if c.is_ascii_uppercase() => false,
        _ => return 0,
    };
    n += 1;
    while let Some(&c) = b.get(n) {
        let ok = c == b'_'
            || c == b'-'
            || c.is_ascii_digit()
            || if lower {
                c.is_ascii_lowercase()
            } else {
                c.is_ascii_uppercase()
            };
        if !ok {
            break;
        }
        n += 1;
    }
    n
}

/// The length of the string (`"..."`, an optional `i` after) or regex (`/.../flags`) literal
/// at the start of `b`, whose first byte is its quote. A literal that does not end on its
/// line is refused: llguidance's lexer does not read it as one, and what follows cannot be
/// told apart from it.
fn literal_len(b: &[u8], rule: &str) -> Result<usize, GrammarError> {
    let q = b[0];
    let what = if q == b'"' { "string" } else { "regex" };
    let mut i = 1;
    loop {
        match b.get(i) {
            None | Some(b'\n') | Some(b'\r') => {
                return Err(limit(
                    rule.to_string(),
                    format!("cannot check the grammar: a {what} literal does not end on its line"),
                ))
            }
            Some(b'\\') if !matches!(b.get(i + 1), None | Some(b'\n' | b'\r')) => i += 2,
            Some(&c) if c == q => break,
            Some(_) => i += 1,
        }
    }
    i += 1;
    let flags: &[u8] = if q == b'"' { b"i" } else { b"imslux" };
    while b.get(i).is_some_and(|c| flags.contains(c)) {
        i += 1;
    }
    Ok(i)
}

/// The length of a special token (`<[^<>\s]+>`) at the start of `b`, or 0.
fn special_len(b: &[u8]) -> usize {
    let mut i = 1;
    while let Some(&c) = b.get(i) {
        if c == b'>' {
            return if i > 1 { i + 1 } else { 0 };
        }
        if c == b'<' || c.is_ascii_whitespace() {
            return 0;
        }
        i += 1;
    }
    0
}

/// The definition that starts at `b` (`[!][?]name[::_][{params}][.prio][[attrs]]:`, how
/// llguidance's parser reads a rule or token definition, which need not start a line): the
/// name's start and end and where its body starts. `None` if there is no definition there.
fn definition(b: &[u8], rule: &str) -> Result<Option<(usize, usize, usize)>, GrammarError> {
    let mut j = 0;
    if b.get(j) == Some(&b'!') {
        j += 1;
    }
    if b.get(j) == Some(&b'?') {
        j += 1;
    }
    let n = ident_len(&b[j..]);
    if n == 0 {
        return Ok(None);
    }
    let (start, end) = (j, j + n);
    let mut k = end;
    let skip_ws = |k: &mut usize| {
        while matches!(b.get(*k), Some(b' ' | b'\t')) {
            *k += 1;
        }
    };
    skip_ws(&mut k);
    if b[k..].starts_with(b"::") {
        k += 2;
        skip_ws(&mut k);
        if b.get(k) != Some(&b'_') {
            return Ok(None);
        }
        k += 1;
        skip_ws(&mut k);
    }
    if b.get(k) == Some(&b'{') {
        // Parameters: names and commas.
        while let Some(&c) = b.get(k) {
            k += 1;
            if c == b'}' || c == b'\n' {
                break;
            }
        }
        skip_ws(&mut k);
    }
    if b.get(k) == Some(&b'.') {
        k += 1;
        skip_ws(&mut k);
        while matches!(b.get(k), Some(b'0'..=b'9' | b'-' | b'+')) {
            k += 1;
        }
        skip_ws(&mut k);
    }
    if b.get(k) == Some(&b'[') {
        // Attributes: names, `=`, numbers, strings and regexes (which may hold `]`).
        k += 1;
        loop {
            match b.get(k) {
                None | Some(b'\n') => return Ok(None),
                Some(b']') => {
                    k += 1;
                    break;
                }
                Some(b'"' | b'/') => k += literal_len(&b[k..], rule)?,
                Some(_) => k += 1,
            }
        }
        skip_ws(&mut k);
    }
    if b.get(k) == Some(&b':') && b.get(k + 1) != Some(&b':') {
        Ok(Some((start, end, k + 1)))
    } else {
        Ok(None)
    }
}

/// Read a Lark grammar's rules flat (strings, regexes, special tokens, comments and
/// directives skipped, an embedded `%json` schema checked with [`check_schema`]), lexing as
/// llguidance does so that nothing it reads as a rule is hidden from the limits.
fn lark_rules(src: &str) -> Result<Vec<LarkRule<'_>>, GrammarError> {
    let b = src.as_bytes();
    let mut rules: Vec<LarkRule> = Vec::new();
    // The rule whose body is being read (none in a directive).
    let mut cur: Option<usize> = None;
    let mut i = 0;
    let mut nest = 0usize;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let rule = cur.map_or("", |r| rules[r].name);
        if c == b'!' || c == b'?' || c == b'_' || c.is_ascii_alphabetic() {
            if let Some((s, e, body)) = definition(&b[i..], &cut(rule, SEG_SHOWN))? {
                let name = &src[i + s..i + e];
                rules.push(LarkRule {
                    name,
                    refs: Vec::new(),
                    groups: 0,
                });
                if rules.len() > MAX_GRAMMAR_RULES {
                    return Err(limit(
                        cut(name, SEG_SHOWN),
                        format!("the grammar has more than {MAX_GRAMMAR_RULES} rules"),
                    ));
                }
                cur = Some(rules.len() - 1);
                nest = 0;
                i += body;
                continue;
            }
        }
        match c {
            // Comments, `//` and `#`, to the end of the line.
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'/' => i += literal_len(&b[i..], &cut(rule, SEG_SHOWN))?,
            b'<' => i += special_len(&b[i..]).max(1),
            b'%' if src[i..].starts_with("%json") => {
                i += 5;
                let mut values = serde_json::Deserializer::from_str(&src[i..]).into_iter::<Value>();
                match values.next() {
                    Some(Ok(schema)) => {
                        check_schema(&schema).map_err(|e| match e {
                            GrammarError::Limit { at, msg } => {
                                limit(format!("{}: %json{at}", cut(rule, SEG_SHOWN)), msg)
                            }
                            e => e,
                        })?;
                        i += values.byte_offset();
                    }
                    _ => {
                        return Err(limit(
                            cut(rule, SEG_SHOWN),
                            "cannot check the grammar: a %json schema does not parse".into(),
                        ))
                    }
                }
            }
            b'%' => {
                // A directive (`%ignore`, `%import`, `%llguidance`, `%override`): what it
                // names belongs to no rule; a definition after it is read as any other.
                cur = None;
                i += 1;
                while b.get(i).is_some_and(u8::is_ascii_lowercase) {
                    i += 1;
                }
            }
            b'(' | b'[' => {
                nest += 1;
                if let Some(r) = cur.map(|r| &mut rules[r]) {
                    r.groups = r.groups.max(nest);
                    if nest > MAX_GRAMMAR_DEPTH {
                        return Err(limit(
                            cut(r.name, SEG_SHOWN),
                            format!("groups nest deeper than {MAX_GRAMMAR_DEPTH} levels"),
                        ));
                    }
                }
                i += 1;
            }
            b')' | b']' => {
                nest = nest.saturating_sub(1);
                i += 1;
            }
            c if c.is_ascii_digit() => {
                // A number (`[0-9]+`, `0x` hex): not a name.
                i += 1;
                if c == b'0' && matches!(b.get(i), Some(b'x' | b'X')) {
                    i += 1;
                    while b.get(i).is_some_and(u8::is_ascii_hexdigit) {
                        i += 1;
                    }
                }
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => {
                let n = ident_len(&b[i..]);
                if n > 0 {
                    if let Some(r) = cur.map(|r| &mut rules[r]) {
                        r.refs.push((&src[i..i + n], nest));
                    }
                    i += n;
                } else {
                    i += src[i..].chars().next().map_or(1, char::len_utf8);
                }
            }
        }
    }
    Ok(rules)
}

/// Check a Lark grammar (kiln's GBNF translated, or a `%llguidance` one): how deep its rules
/// chain, counting nested groups, and how many there are.
pub fn check_lark(src: &str) -> Result<(), GrammarError> {
    let rules = lark_rules(src)?;
    let index: HashMap<&str, usize> = rules.iter().enumerate().map(|(i, r)| (r.name, i)).collect();
    // Iterative depth-first over the rules, each measured once; a rule still being walked
    // (recursion, as in any JSON grammar) counts nothing.
    const OPEN: usize = usize::MAX;
    let mut depth: Vec<Option<usize>> = vec![None; rules.len()];
    for start in 0..rules.len() {
        if depth[start].is_some() {
            continue;
        }
        // (rule, next ref, deepest so far)
        let mut stack: Vec<(usize, usize, usize)> = vec![(start, 0, rules[start].groups)];
        depth[start] = Some(OPEN);
        while let Some(top) = stack.last_mut() {
            let (r, next, deepest) = *top;
            if let Some(&(name, nest)) = rules[r].refs.get(next) {
                top.1 += 1;
                let Some(&t) = index.get(name) else { continue };
                match depth[t] {
                    Some(OPEN) => {}
                    Some(d) => top.2 = deepest.max(nest + d),
                    None => {
                        if stack.len() + 1 > MAX_GRAMMAR_DEPTH {
                            return Err(limit(
                                cut(rules[t].name, SEG_SHOWN),
                                format!(
                                    "rules refer to rules deeper than {MAX_GRAMMAR_DEPTH} levels"
                                ),
                            ));
                        }
                        depth[t] = Some(OPEN);
                        stack.push((t, 0, rules[t].groups));
                    }
                }
            } else {
                stack.pop();
                let d = deepest + 1;
                if d > MAX_GRAMMAR_DEPTH {
                    return Err(limit(
                        cut(rules[r].name, SEG_SHOWN),
                        format!(
                            "rules refer to rules (counting nested groups) deeper than {MAX_GRAMMAR_DEPTH} levels"
                        ),
                    ));
                }
                depth[r] = Some(d);
                if let Some(p) = stack.last_mut() {
                    // The nesting at which the parent named this rule.
                    let nest = rules[p.0].refs[p.1 - 1].1;
                    p.2 = p.2.max(nest + d);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
