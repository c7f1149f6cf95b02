//! The pickle stack machine: one loop over opcodes, no recursion. What the opcodes that apply
//! globals do (REDUCE, NEWOBJ, BUILD, persistent ids) is in `calls.rs`.

use std::collections::HashMap;

use super::cursor::{le_int, Cursor};
use super::globals::{resolve, MAX_GLOBAL_NAME};
use super::ops::*;
use super::value::{ObjId, Object, StorageRef, Value};
use super::{Limits, PickleError, Unpickled};

/// Why a step failed; [`Machine::run`] adds the opcode's offset.
pub(super) enum Fault {
    Malformed(String),
    Refused { global: String, reason: String },
}

impl From<String> for Fault {
    fn from(reason: String) -> Fault {
        Fault::Malformed(reason)
    }
}

pub(super) type Step<T> = Result<T, Fault>;

pub(super) fn malformed<T>(reason: impl Into<String>) -> Step<T> {
    Err(Fault::Malformed(reason.into()))
}

pub(super) struct Machine<'a> {
    cur: Cursor<'a>,
    limits: Limits,
    stack: Vec<Value>,
    /// Stack lengths at each open MARK (CPython's metastack).
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    pub(super) objects: Vec<Object>,
    /// Every storage a persistent id declared, by key.
    pub(super) storages: HashMap<String, StorageRef>,
    globals_named: usize,
}

impl<'a> Machine<'a> {
    pub(super) fn new(bytes: &'a [u8], limits: Limits) -> Machine<'a> {
        Machine {
            cur: Cursor::new(bytes),
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            objects: Vec::new(),
            storages: HashMap::new(),
            globals_named: 0,
        }
    }

    /// Runs to the first STOP.
    pub(super) fn run(mut self) -> Result<Unpickled, PickleError> {
        loop {
            let at = self.cur.pos();
            let step = self
                .cur
                .u8("an opcode (no STOP)")
                .map_err(Fault::from)
                .and_then(|op| self.step(op));
            match step {
                Ok(None) => {}
                Ok(Some(root)) => {
                    return Ok(Unpickled {
                        objects: self.objects,
                        storages: self.storages,
                        root,
                        len: self.cur.pos(),
                    })
                }
                Err(Fault::Malformed(reason)) => {
                    return Err(PickleError::Malformed { offset: at, reason })
                }
                Err(Fault::Refused { global, reason }) => {
                    return Err(PickleError::Refused {
                        offset: at,
                        global,
                        reason,
                    })
                }
            }
        }
    }

    // --- stack, marks, memo, arena ----------------------------------------------------------

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    pub(super) fn push(&mut self, v: Value) -> Step<()> {
        if self.stack.len() >= self.limits.max_stack {
            return malformed(format!(
                "the stack grows past {} entries",
                self.limits.max_stack
            ));
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Step<Value> {
        if self.stack.len() <= self.floor() {
            return malformed("stack underflow");
        }
        Ok(self.stack.pop().unwrap_or(Value::None))
    }

    fn top(&self) -> Step<Value> {
        if self.stack.len() <= self.floor() {
            return malformed("stack underflow");
        }
        Ok(self.stack[self.stack.len() - 1])
    }

    /// Pops everything above the last MARK, and the mark.
    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let Some(m) = self.marks.pop() else {
            return malformed("an opcode needs a MARK but none is open");
        };
        Ok(self.stack.split_off(m))
    }

    pub(super) fn alloc(&mut self, o: Object) -> Step<Value> {
        if self.objects.len() >= self.limits.max_objects {
            return malformed(format!("more than {} objects", self.limits.max_objects));
        }
        let id = ObjId(self.objects.len() as u32);
        self.objects.push(o);
        Ok(Value::Obj(id))
    }

    fn push_obj(&mut self, o: Object) -> Step<()> {
        let v = self.alloc(o)?;
        self.push(v)
    }

    pub(super) fn obj(&self, v: Value) -> Option<&Object> {
        match v {
            Value::Obj(ObjId(i)) => self.objects.get(i as usize),
            _ => None,
        }
    }

    fn obj_mut(&mut self, v: Value) -> Option<&mut Object> {
        match v {
            Value::Obj(ObjId(i)) => self.objects.get_mut(i as usize),
            _ => None,
        }
    }

    pub(super) fn kind(&self, v: Value) -> &'static str {
        match v {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Obj(_) => self.obj(v).map_or("object", Object::kind),
        }
    }

    fn memo_put(&mut self, key: u32) -> Step<()> {
        let v = self.top()?;
        if self.memo.len() >= self.limits.max_memo && !self.memo.contains_key(&key) {
            return malformed(format!("more than {} memo entries", self.limits.max_memo));
        }
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Step<()> {
        match self.memo.get(&key) {
            Some(&v) => self.push(v),
            None => malformed(format!("memo key {key} was never stored")),
        }
    }

    // --- containers -----------------------------------------------------------------------

    fn set_items(&mut self, items: Vec<Value>) -> Step<()> {
        if !items.len().is_multiple_of(2) {
            return malformed("SETITEMS with an odd number of entries");
        }
        let target = self.top()?;
        let kind = self.kind(target);
        match self.obj_mut(target) {
            Some(Object::Dict(d)) => {
                d.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            // A placeholder absorbs what its class would have stored.
            Some(Object::Opaque(_)) => Ok(()),
            _ => malformed(format!("SETITEM(S) on a {kind}")),
        }
    }

    fn append_items(&mut self, items: Vec<Value>, what: &str) -> Step<()> {
        let target = self.top()?;
        let kind = self.kind(target);
        match self.obj_mut(target) {
            Some(Object::List(l)) => {
                l.extend(items);
                Ok(())
            }
            Some(Object::Opaque(_)) => Ok(()),
            _ => malformed(format!("{what} on a {kind}")),
        }
    }

    fn string(&mut self, bytes: &[u8]) -> Step<()> {
        // Python decodes with 'surrogatepass'; such strings are never tensor names.
        self.push_obj(Object::Str(String::from_utf8_lossy(bytes).into_owned()))
    }

    fn global(&mut self, module: &[u8], name: &[u8]) -> Step<()> {
        self.globals_named += 1;
        if self.globals_named > self.limits.max_globals {
            return malformed(format!(
                "more than {} globals named",
                self.limits.max_globals
            ));
        }
        let text = |b: &[u8]| -> Step<String> {
            if b.len() > MAX_GLOBAL_NAME {
                return malformed(format!(
                    "a global name of {} bytes (limit {MAX_GLOBAL_NAME})",
                    b.len()
                ));
            }
            String::from_utf8(b.to_vec())
                .map_err(|_| Fault::Malformed("a global name is not UTF-8".into()))
        };
        let (module, name) = (text(module)?, text(name)?);
        let g = resolve(&module, &name).map_err(|reason| Fault::Refused {
            global: format!("{module}.{name}"),
            reason: reason.to_string(),
        })?;
        self.push_obj(Object::Global(g))
    }

    fn str_value(&self, v: Value) -> Option<&str> {
        match self.obj(v) {
            Some(Object::Str(s)) => Some(s),
            _ => None,
        }
    }

    // --- one opcode ---------------------------------------------------------------------

    fn int_line(&mut self, what: &str, allow_bool: bool) -> Step<()> {
        let line = self.cur.line(what)?;
        let text = std::str::from_utf8(line).unwrap_or("").trim();
        let text = text.strip_suffix('L').unwrap_or(text);
        match text {
            "00" if allow_bool => return self.push(Value::Bool(false)),
            "01" if allow_bool => return self.push(Value::Bool(true)),
            _ => {}
        }
        if let Ok(i) = text.parse::<i64>() {
            return self.push(Value::Int(i));
        }
        let digits = text.strip_prefix('-').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return self.push_obj(Object::BigInt(Vec::new()));
        }
        malformed(format!(
            "{what} '{}' is not an integer",
            text.escape_debug()
        ))
    }

    fn long_bytes(&mut self, bytes: &[u8]) -> Step<()> {
        match le_int(bytes) {
            Some(i) => self.push(Value::Int(i)),
            None => self.push_obj(Object::BigInt(bytes.to_vec())),
        }
    }

    fn memo_index(&mut self, what: &str) -> Step<u32> {
        let line = self.cur.line(what)?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .ok_or_else(|| Fault::Malformed(format!("{what} is not a memo index")))
    }

    /// Executes one opcode; `Some(root)` at STOP.
    fn step(&mut self, op: u8) -> Step<Option<Value>> {
        let c = &mut self.cur;
        match op {
            STOP => return self.pop().map(Some),
            PROTO => {
                let p = c.u8("the PROTO version")?;
                if p > HIGHEST_PROTOCOL {
                    return malformed(format!("unsupported pickle protocol {p}"));
                }
            }
            FRAME => {
                let n = c.u64("the FRAME length")?;
                if n > c.remaining() as u64 {
                    return malformed(format!(
                        "a frame of {n} bytes runs past the end ({} remain)",
                        c.remaining()
                    ));
                }
            }
            MARK => {
                if self.marks.len() >= self.limits.max_marks {
                    return malformed(format!("more than {} nested MARKs", self.limits.max_marks));
                }
                self.marks.push(self.stack.len());
            }
            POP => {
                if self.stack.len() > self.floor() {
                    self.stack.pop();
                } else if self.marks.pop().is_none() {
                    return malformed("stack underflow");
                }
            }
            POP_MARK => {
                self.pop_mark()?;
            }
            DUP => {
                let v = self.top()?;
                self.push(v)?;
            }
            NONE => self.push(Value::None)?,
            NEWTRUE => self.push(Value::Bool(true))?,
            NEWFALSE => self.push(Value::Bool(false))?,
            INT => self.int_line("an INT literal", true)?,
            LONG => self.int_line("a LONG literal", false)?,
            BININT => {
                let v = c.i32("a BININT")?;
                self.push(Value::Int(v.into()))?;
            }
            BININT1 => {
                let v = c.u8("a BININT1")?;
                self.push(Value::Int(v.into()))?;
            }
            BININT2 => {
                let v = c.u16("a BININT2")?;
                self.push(Value::Int(v.into()))?;
            }
            LONG1 => {
                let n = c.u8("a LONG1 length")?;
                let b = c.take(n.into(), "a LONG1")?;
                self.long_bytes(b)?;
            }
            LONG4 => {
                let n = c.i32("a LONG4 length")?;
                let n = u64::try_from(n)
                    .map_err(|_| Fault::Malformed(format!("negative LONG4 length {n}")))?;
                let b = c.take(n, "a LONG4")?;
                self.long_bytes(b)?;
            }
            FLOAT => {
                let line = c.line("a FLOAT literal")?;
                let f = std::str::from_utf8(line)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .ok_or_else(|| Fault::Malformed("a FLOAT literal is not a number".into()))?;
                self.push(Value::Float(f))?;
            }
            BINFLOAT => {
                let f = c.f64_be("a BINFLOAT")?;
                self.push(Value::Float(f))?;
            }
            STRING => {
                let line = c.line("a STRING literal")?;
                let quoted = line.len() >= 2
                    && (line[0] == b'\'' || line[0] == b'"')
                    && line[line.len() - 1] == line[0];
                let inner = if quoted {
                    &line[1..line.len() - 1]
                } else {
                    line
                };
                self.string(inner)?;
            }
            UNICODE => {
                let line = c.line("a UNICODE literal")?;
                self.string(line)?;
            }
            BINSTRING => {
                let n = c.i32("a BINSTRING length")?;
                let n = u64::try_from(n)
                    .map_err(|_| Fault::Malformed(format!("negative BINSTRING length {n}")))?;
                let b = c.take(n, "a BINSTRING")?;
                self.string(b)?;
            }
            SHORT_BINSTRING | SHORT_BINUNICODE => {
                let n = c.u8("a short string length")?;
                let b = c.take(n.into(), "a short string")?;
                self.string(b)?;
            }
            BINUNICODE => {
                let n = c.u32("a BINUNICODE length")?;
                let b = c.take(n.into(), "a BINUNICODE string")?;
                self.string(b)?;
            }
            BINUNICODE8 => {
                let n = c.u64("a BINUNICODE8 length")?;
                let b = c.take(n, "a BINUNICODE8 string")?;
                self.string(b)?;
            }
            SHORT_BINBYTES => {
                let n = c.u8("a SHORT_BINBYTES length")?;
                let b = c.take(n.into(), "SHORT_BINBYTES")?;
                self.push_obj(Object::Bytes(b.len()))?;
            }
            BINBYTES => {
                let n = c.u32("a BINBYTES length")?;
                let b = c.take(n.into(), "BINBYTES")?;
                self.push_obj(Object::Bytes(b.len()))?;
            }
            BINBYTES8 | BYTEARRAY8 => {
                let n = c.u64("a BINBYTES8 length")?;
                let b = c.take(n, "BINBYTES8")?;
                self.push_obj(Object::Bytes(b.len()))?;
            }
            EMPTY_TUPLE => self.push_obj(Object::Tuple(Vec::new()))?,
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = usize::from(op - TUPLE1 + 1);
                if self.stack.len() < self.floor() + n {
                    return malformed("stack underflow");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push_obj(Object::Tuple(items))?;
            }
            TUPLE => {
                let items = self.pop_mark()?;
                self.push_obj(Object::Tuple(items))?;
            }
            EMPTY_LIST => self.push_obj(Object::List(Vec::new()))?,
            LIST => {
                let items = self.pop_mark()?;
                self.push_obj(Object::List(items))?;
            }
            APPEND => {
                let v = self.pop()?;
                self.append_items(vec![v], "APPEND")?;
            }
            APPENDS => {
                let items = self.pop_mark()?;
                self.append_items(items, "APPENDS")?;
            }
            EMPTY_SET => self.push_obj(Object::List(Vec::new()))?,
            ADDITEMS => {
                let items = self.pop_mark()?;
                self.append_items(items, "ADDITEMS")?;
            }
            FROZENSET => {
                let items = self.pop_mark()?;
                self.push_obj(Object::List(items))?;
            }
            EMPTY_DICT => self.push_obj(Object::Dict(Vec::new()))?,
            DICT => {
                let items = self.pop_mark()?;
                if !items.len().is_multiple_of(2) {
                    return malformed("DICT with an odd number of entries");
                }
                let pairs = items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect();
                self.push_obj(Object::Dict(pairs))?;
            }
            SETITEM => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            SETITEMS => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            PUT => {
                let i = self.memo_index("a PUT index")?;
                self.memo_put(i)?;
            }
            BINPUT => {
                let i = c.u8("a BINPUT index")?;
                self.memo_put(i.into())?;
            }
            LONG_BINPUT => {
                let i = c.u32("a LONG_BINPUT index")?;
                self.memo_put(i)?;
            }
            MEMOIZE => {
                let i = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                self.memo_put(i)?;
            }
            GET => {
                let i = self.memo_index("a GET index")?;
                self.memo_get(i)?;
            }
            BINGET => {
                let i = c.u8("a BINGET index")?;
                self.memo_get(i.into())?;
            }
            LONG_BINGET => {
                let i = c.u32("a LONG_BINGET index")?;
                self.memo_get(i)?;
            }
            GLOBAL => {
                let module = c.line("a GLOBAL module")?;
                let name = c.line("a GLOBAL name")?;
                self.global(module, name)?;
            }
            STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Some(m), Some(n)) = (self.str_value(module), self.str_value(name)) else {
                    return malformed("STACK_GLOBAL needs two strings");
                };
                let (m, n) = (m.as_bytes().to_vec(), n.as_bytes().to_vec());
                self.global(&m, &n)?;
            }
            REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.reduce(callable, args)?;
                self.push(v)?;
            }
            NEWOBJ => {
                let _args = self.pop()?;
                let cls = self.pop()?;
                let v = self.instantiate(cls)?;
                self.push(v)?;
            }
            NEWOBJ_EX => {
                let _kwargs = self.pop()?;
                let _args = self.pop()?;
                let cls = self.pop()?;
                let v = self.instantiate(cls)?;
                self.push(v)?;
            }
            INST => {
                let module = c.line("an INST module")?;
                let name = c.line("an INST name")?;
                self.global(module, name)?;
                let cls = self.pop()?;
                self.pop_mark()?;
                let v = self.instantiate(cls)?;
                self.push(v)?;
            }
            OBJ => {
                let items = self.pop_mark()?;
                let Some(&cls) = items.first() else {
                    return malformed("OBJ without a class");
                };
                let v = self.instantiate(cls)?;
                self.push(v)?;
            }
            BUILD => {
                let state = self.pop()?;
                let target = self.top()?;
                self.build(target, state)?;
            }
            BINPERSID => {
                let pid = self.pop()?;
                let v = self.persistent_load(pid)?;
                self.push(v)?;
            }
            PERSID => return malformed("text persistent ids (PERSID) are not used by torch.save"),
            EXT1 | EXT2 | EXT4 => {
                return malformed("extension registry codes (EXT1/2/4) are not supported")
            }
            NEXT_BUFFER | READONLY_BUFFER => {
                return malformed("out-of-band buffers (protocol 5) are not supported")
            }
            other => return malformed(format!("unknown opcode 0x{other:02x}")),
        }
        Ok(None)
    }
}
