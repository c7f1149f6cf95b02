//! Hand-assembled pickles: the machine's semantics, its refusals and its limits.

use super::*;

/// `X` + u32 length + UTF-8.
fn s(text: &str) -> Vec<u8> {
    let mut out = vec![b'X'];
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn refused(bytes: &[u8]) -> String {
    match unpickle(bytes) {
        Err(PickleError::Refused { global, .. }) => global,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn malformed(bytes: &[u8]) -> String {
    match unpickle(bytes) {
        Err(PickleError::Malformed { reason, .. }) => reason,
        other => panic!("expected a malformed error, got {other:?}"),
    }
}

/// `{name: _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 6), 0, (2, 3), (3, 1), False, OrderedDict())}`
fn tensor_dict(name: &str) -> Vec<u8> {
    cat(&[
        b"\x80\x02}q\x00(",
        &s(name),
        b"ctorch._utils\n_rebuild_tensor_v2\nq\x01((",
        &s("storage"),
        b"ctorch\nFloatStorage\nq\x02",
        &s("0"),
        &s("cpu"),
        b"K\x06tq\x03QK\x00K\x02K\x03\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)Rtq\x04Ru.",
    ])
}

#[test]
fn reads_a_state_dict_entry() {
    let u = unpickle(&tensor_dict("w")).unwrap();
    let Some(Object::Dict(items)) = u.get(u.root) else {
        panic!("root is not a dict");
    };
    assert_eq!(items.len(), 1);
    assert_eq!(u.str(items[0].0), Some("w"));
    let Some(Object::Tensor(t)) = u.get(items[0].1) else {
        panic!("value is not a tensor");
    };
    assert_eq!(t.size, [2, 3]);
    assert_eq!(t.stride, [3, 1]);
    assert_eq!(t.storage.key, "0");
    assert_eq!(t.storage.numel, 6);
    assert_eq!(t.dtype.name, "float32");
    assert_eq!(u.storages().len(), 1);
    assert_eq!(u.len, tensor_dict("w").len());
}

#[test]
fn memo_shares_objects() {
    // d = {}; memo[0] = d; l = [memo[0]]; d['k'] = 1 -> l[0] sees the item.
    let p = cat(&[
        b"\x80\x02}q\x00]q\x01h\x00a0h\x00",
        &s("k"),
        b"K\x01s0h\x01.",
    ]);
    let u = unpickle(&p).unwrap();
    let Some(Object::List(l)) = u.get(u.root) else {
        panic!("root is not a list");
    };
    let Some(Object::Dict(d)) = u.get(l[0]) else {
        panic!("item is not a dict");
    };
    assert_eq!(d.len(), 1);
}

#[test]
fn code_running_globals_are_refused_on_sight() {
    assert_eq!(refused(b"cos\nsystem\n."), "os.system");
    assert_eq!(refused(b"cposix\nsystem\n."), "posix.system");
    assert_eq!(refused(b"cbuiltins\neval\n."), "builtins.eval");
    assert_eq!(
        refused(&cat(&[
            b"\x80\x04",
            &s("builtins"),
            &s("getattr"),
            b"\x93."
        ])),
        "builtins.getattr"
    );
    assert_eq!(
        refused(&cat(&[&s("subprocess"), &s("Popen"), b"\x93."])),
        "subprocess.Popen"
    );
}

#[test]
fn unknown_globals_are_values_but_never_applied() {
    // Referenced: fine.
    let u = unpickle(b"cmymodule\nNet\n.").unwrap();
    assert!(matches!(u.get(u.root), Some(Object::Global(_))));
    // Applied: REDUCE, NEWOBJ, INST, OBJ, copyreg._reconstructor.
    assert_eq!(refused(b"cmymodule\nNet\n)R."), "mymodule.Net");
    assert_eq!(refused(b"\x80\x02cmymodule\nNet\n)\x81."), "mymodule.Net");
    assert_eq!(refused(b"(imymodule\nNet\n."), "mymodule.Net");
    assert_eq!(refused(b"(cmymodule\nNet\no."), "mymodule.Net");
    assert_eq!(
        refused(b"ccopyreg\n_reconstructor\n(cmymodule\nNet\ncbuiltins\nobject\nNtR."),
        "mymodule.Net"
    );
}

#[test]
fn inert_globals_become_placeholders() {
    let p = b"\x80\x02cargparse\nNamespace\n)\x81}b.";
    let u = unpickle(p).unwrap();
    let Some(&Object::Opaque(class)) = u.get(u.root) else {
        panic!("not a placeholder");
    };
    assert!(
        matches!(u.get(class), Some(Object::Global(globals::Global::Inert(n))) if n == "argparse.Namespace")
    );
    let p = b"cnumpy.core.multiarray\nscalar\n(K\x01tR.";
    assert!(unpickle(p).is_ok());
    // Items given to a placeholder are absorbed.
    let p = b"\x80\x02cpytorch_lightning.utilities.parsing\nAttributeDict\n)\x81(K\x01K\x02u.";
    assert!(unpickle(p).is_ok());
}

#[test]
fn malformed_pickles_are_errors() {
    assert!(malformed(b"").contains("ends"));
    assert!(malformed(b"\x80\x06.").contains("protocol 6"));
    assert!(malformed(b"0").contains("underflow"));
    assert!(malformed(b"(0t.").contains("MARK"));
    assert!(malformed(b"h\x05.").contains("memo key 5"));
    assert!(malformed(b"X\xff\xff\xff\xffabc.").contains("ends inside"));
    assert!(malformed(b"\x8d\xff\xff\xff\xff\xff\xff\xff\xffab.").contains("ends inside"));
    assert!(malformed(b"\x95\x00\x00\x00\x00\x00\x00\x00\x01.").contains("frame"));
    assert!(malformed(b"]K\x01K\x02s.").contains("SETITEM"));
    assert!(malformed(b"K\x01K\x02s.").contains("underflow"));
    assert!(malformed(b"\xff").contains("unknown opcode"));
    assert!(malformed(b"Pabc\n.").contains("PERSID"));
    assert!(malformed(b"\x82\x01.").contains("extension"));
    // A persistent id that is not a storage.
    assert!(malformed(&cat(&[&s("evil"), b"\x85Q."])).contains("persistent id"));
}

#[test]
fn limits_hold() {
    let deep = vec![b'('; 100_000];
    assert!(malformed(&deep).contains("MARK"));
    let limits = Limits {
        max_stack: 10,
        ..Limits::default()
    };
    let wide = vec![b'N'; 20];
    assert!(matches!(
        unpickle_with(&wide, limits),
        Err(PickleError::Malformed { .. })
    ));
    // Nested containers 400 000 deep are fine for the machine (nothing recurses)...
    let mut nested = b"\x80\x02]".to_vec();
    for _ in 0..400_000 {
        nested.extend_from_slice(b"]\x85");
    }
    nested.push(b'.');
    assert!(unpickle(&nested).is_ok());
    // ...and a million objects is the limit.
    let many = [b"\x80\x02".as_slice(), &b"]0".repeat(1 << 20), b"]."].concat();
    assert!(malformed(&many).contains("objects"));
    let globals = [
        b"\x80\x02".as_slice(),
        &b"cm\nn\n0".repeat(1 << 16),
        b"cm\nn\n.",
    ]
    .concat();
    assert!(malformed(&globals).contains("globals"));
}

#[test]
fn tensor_arguments_are_checked() {
    // Negative size.
    let mut p = tensor_dict("w");
    let at = p.windows(2).position(|w| w == b"K\x02").unwrap();
    p.splice(at..at + 2, *b"J\xff\xff\xff\xff");
    assert!(malformed(&p).contains("negative"));
    // A rebuild whose storage argument is an int.
    let p = b"ctorch._utils\n_rebuild_tensor_v2\n(K\x00K\x00)))\x89NtR.";
    assert!(malformed(p).contains("not a storage"));
}
