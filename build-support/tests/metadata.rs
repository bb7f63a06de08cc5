//! Tests of `build_support::metadata` (AMDGPU code object notes, occupancy) and
//! `build_support::ptx` (PTX entries), against real compiler output in `tests/fixtures/`
//! (see `tests/fixtures/README.md`) and hand-made inputs.

use build_support::metadata::{
    occupancy, parse_code_object, ArgMetadata, ArgValueKind, CodeObjectMetadata, KernelMetadata, MetadataError,
    Occupancy,
};
use build_support::ptx::{parse_ptx, PtxError, PtxParam};
use rmpv::Value;

const GFX90A: &[u8] = include_bytes!("fixtures/fixture.gfx90a.co");
const GFX1100: &[u8] = include_bytes!("fixtures/fixture.gfx1100.co");
const PTX: &str = include_str!("fixtures/fixture.ptx");

fn arg(offset: u32, size: u32, kind: ArgValueKind, space: Option<&str>, access: Option<&str>) -> ArgMetadata {
    ArgMetadata {
        offset,
        size,
        value_kind: kind,
        address_space: space.map(str::to_string),
        actual_access: access.map(str::to_string),
        name: None,
    }
}

/// The argument lists are the same on every AMD target (the ABI does not depend on the CPU).
fn reverse_block_args() -> Vec<ArgMetadata> {
    vec![
        arg(0, 8, ArgValueKind::GlobalBuffer, Some("generic"), None),
        arg(8, 4, ArgValueKind::ByValue, None, None),
    ]
}

/// `scale_add(x: &[f32], y: &mut [f32], alpha: f32, block: u32)`: each slice is a
/// pointer + a usize length.
fn scale_add_args() -> Vec<ArgMetadata> {
    vec![
        arg(0, 8, ArgValueKind::GlobalBuffer, Some("generic"), Some("read_only")),
        arg(8, 8, ArgValueKind::ByValue, None, None),
        arg(16, 8, ArgValueKind::GlobalBuffer, Some("generic"), None),
        arg(24, 8, ArgValueKind::ByValue, None, None),
        arg(32, 4, ArgValueKind::ByValue, None, None),
        arg(36, 4, ArgValueKind::ByValue, None, None),
    ]
}

// --------------------------------------------------------------------------------------
// Code objects from the fixtures (expected values from `llvm-readelf --notes`)
// --------------------------------------------------------------------------------------

#[test]
fn gfx90a_fixture_metadata() {
    let m = parse_code_object(GFX90A).unwrap();
    assert_eq!(m.target, "amdgcn-amd-amdhsa--gfx90a");
    assert_eq!(m.arch, "gfx90a");
    assert_eq!(m.version, (1, 2));
    let names: Vec<_> = m.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["reverse_block", "scale_add"]);

    let rb = m.kernel("reverse_block").unwrap();
    assert_eq!(
        *rb,
        KernelMetadata {
            name: "reverse_block".into(),
            symbol: "reverse_block.kd".into(),
            args: reverse_block_args(),
            kernarg_segment_size: 12,
            kernarg_segment_align: 8,
            group_segment_fixed_size: 0,
            private_segment_fixed_size: 0,
            sgpr_count: 12,
            vgpr_count: 4,
            agpr_count: 0,
            sgpr_spill_count: 0,
            vgpr_spill_count: 0,
            wavefront_size: 64,
            max_flat_workgroup_size: 1024,
            uses_dynamic_stack: false,
            // rustc's dynamic LDS is not visible in the metadata.
            dynamic_lds: false,
        }
    );

    let sa = m.kernel("scale_add").unwrap();
    assert_eq!(sa.symbol, "scale_add.kd");
    assert_eq!(sa.args, scale_add_args());
    assert_eq!(sa.kernarg_segment_size, 40);
    assert_eq!(sa.kernarg_segment_align, 8);
    assert_eq!((sa.sgpr_count, sa.vgpr_count, sa.agpr_count), (14, 4, 0));
    assert_eq!(sa.wavefront_size, 64);
    assert_eq!(sa.max_flat_workgroup_size, 1024);
    assert_eq!((sa.group_segment_fixed_size, sa.private_segment_fixed_size), (0, 0));
    assert_eq!(sa.spills(), 0);
    assert!(!sa.uses_dynamic_stack);
    assert_eq!(sa.explicit_args().count(), 6);
}

#[test]
fn misaligned_input_is_accepted() {
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(GFX90A);
    let from_shifted = parse_code_object(&shifted[1..]).unwrap();
    assert_eq!(from_shifted, parse_code_object(GFX90A).unwrap());
}

#[test]
fn gfx1100_fixture_metadata() {
    let m = parse_code_object(GFX1100).unwrap();
    assert_eq!(m.target, "amdgcn-amd-amdhsa--gfx1100");
    assert_eq!(m.arch, "gfx1100");
    assert_eq!(m.version, (1, 2));
    assert_eq!(m.kernels.len(), 2);

    let rb = m.kernel("reverse_block").unwrap();
    assert_eq!(rb.symbol, "reverse_block.kd");
    assert_eq!(rb.args, reverse_block_args());
    assert_eq!(rb.kernarg_segment_size, 12);
    assert_eq!(rb.wavefront_size, 32);
    // `.agpr_count` is absent on RDNA: defaults to 0.
    assert_eq!((rb.sgpr_count, rb.vgpr_count, rb.agpr_count), (16, 4, 0));
    assert_eq!((rb.sgpr_spill_count, rb.vgpr_spill_count), (0, 0));

    let sa = m.kernel("scale_add").unwrap();
    assert_eq!(sa.args, scale_add_args());
    assert_eq!(sa.kernarg_segment_size, 40);
    assert_eq!(sa.wavefront_size, 32);
    assert_eq!((sa.sgpr_count, sa.vgpr_count, sa.agpr_count), (18, 4, 0));
    assert_eq!(sa.spills(), 0);
    assert_eq!(sa.max_flat_workgroup_size, 1024);
    assert!(m.kernel("nope").is_none());
}

// --------------------------------------------------------------------------------------
// Errors
// --------------------------------------------------------------------------------------

#[test]
fn not_elf() {
    assert!(matches!(
        parse_code_object(b"hello, world: not an ELF file"),
        Err(MetadataError::NotElf(_))
    ));
    assert!(matches!(parse_code_object(b""), Err(MetadataError::NotElf(_))));
    // ELF magic but nothing after it.
    assert!(matches!(
        parse_code_object(b"\x7fELF\x02\x01\x01"),
        Err(MetadataError::NotElf(_))
    ));
}

#[test]
fn x86_elf_is_not_amdgpu() {
    // A synthetic x86-64 header...
    let mut x86 = elf_with_note(&[]);
    x86[18..20].copy_from_slice(&62u16.to_le_bytes());
    assert_eq!(parse_code_object(&x86), Err(MetadataError::NotAmdgpu { machine: 62 }));
    // ...and the host's /bin/true when there is one.
    if let Ok(bytes) = std::fs::read("/bin/true") {
        match parse_code_object(&bytes) {
            Err(MetadataError::NotAmdgpu { machine }) => assert_ne!(machine, 224),
            other => panic!("/bin/true: expected NotAmdgpu, got {other:?}"),
        }
    }
}

/// Offset of the AMDGPU metadata note header (namesz, descsz, type, "AMDGPU\0\0") in a file.
fn note_header_offset(bytes: &[u8]) -> usize {
    let pattern = [&32u32.to_le_bytes()[..], b"AMDGPU\0\0"].concat();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
        .expect("metadata note");
    at - 8
}

#[test]
fn truncated_file_is_rejected() {
    // Cut inside the note: the PT_NOTE segment points past the end of the data.
    let note = note_header_offset(GFX90A);
    let cut = &GFX90A[..note + 40];
    match parse_code_object(cut) {
        Err(MetadataError::NotElf(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected NotElf, got {other:?}"),
    }
}

#[test]
fn truncated_note_payload_is_bad_messagepack() {
    // Shrink n_descsz: the note is well-formed ELF but its MessagePack is cut short.
    let mut bytes = GFX90A.to_vec();
    let note = note_header_offset(&bytes);
    let descsz = u32::from_le_bytes(bytes[note + 4..note + 8].try_into().unwrap());
    bytes[note + 4..note + 8].copy_from_slice(&(descsz / 2).to_le_bytes());
    match parse_code_object(&bytes) {
        Err(MetadataError::BadMessagePack(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected BadMessagePack, got {other:?}"),
    }
}

#[test]
fn other_note_type_means_no_metadata() {
    let mut bytes = GFX90A.to_vec();
    let note = note_header_offset(&bytes);
    bytes[note + 8..note + 12].copy_from_slice(&33u32.to_le_bytes());
    assert_eq!(parse_code_object(&bytes), Err(MetadataError::NoMetadataNote));
    // And a code object without any note.
    assert_eq!(
        parse_code_object(&elf_with_note(&[])),
        Err(MetadataError::NoMetadataNote)
    );
}

#[test]
fn error_messages_are_descriptive() {
    let msgs = [
        (
            MetadataError::NotElf("missing the \\x7fELF magic".into()),
            "not a valid ELF",
        ),
        (MetadataError::NotAmdgpu { machine: 62 }, "x86-64"),
        (MetadataError::NoMetadataNote, "NT_AMDGPU_METADATA"),
        (
            MetadataError::BadMessagePack("cut".into()),
            "malformed AMDGPU metadata: cut",
        ),
        (
            MetadataError::MissingField {
                kernel: "kernel `k`".into(),
                field: ".sgpr_count",
            },
            "`.sgpr_count`",
        ),
    ];
    for (e, needle) in msgs {
        let s = e.to_string();
        assert!(s.contains(needle), "{s:?} should contain {needle:?}");
    }
    assert_eq!(
        MetadataError::MissingField {
            kernel: "kernel `k`".into(),
            field: ".sgpr_count"
        }
        .to_string(),
        "AMDGPU metadata of kernel `k` lacks the required field `.sgpr_count`"
    );
}

// --------------------------------------------------------------------------------------
// Synthetic metadata
// --------------------------------------------------------------------------------------

/// A minimal ELF64 EM_AMDGPU file whose only PT_NOTE holds `notes` (raw note records).
fn elf_with_note(notes: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(b"\x7fELF\x02\x01\x01\x40\x04\0\0\0\0\0\0\0"); // ELF64 LE, AMDGPU HSA ABI v4
    f.extend_from_slice(&3u16.to_le_bytes()); // e_type ET_DYN
    f.extend_from_slice(&224u16.to_le_bytes()); // e_machine EM_AMDGPU
    f.extend_from_slice(&1u32.to_le_bytes()); // e_version
    f.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    f.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    f.extend_from_slice(&0x53fu32.to_le_bytes()); // e_flags
    f.extend_from_slice(&64u16.to_le_bytes()); // e_ehsize
    f.extend_from_slice(&56u16.to_le_bytes()); // e_phentsize
    f.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    f.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    assert_eq!(f.len(), 64);
    let off = 64 + 56u64;
    f.extend_from_slice(&4u32.to_le_bytes()); // p_type PT_NOTE
    f.extend_from_slice(&4u32.to_le_bytes()); // p_flags R
    f.extend_from_slice(&off.to_le_bytes()); // p_offset
    f.extend_from_slice(&off.to_le_bytes()); // p_vaddr
    f.extend_from_slice(&off.to_le_bytes()); // p_paddr
    f.extend_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
    f.extend_from_slice(&(notes.len() as u64).to_le_bytes()); // p_memsz
    f.extend_from_slice(&4u64.to_le_bytes()); // p_align
    f.extend_from_slice(notes);
    f
}

fn note(owner: &[u8], ty: u32, desc: &[u8]) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&(owner.len() as u32 + 1).to_le_bytes());
    n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    n.extend_from_slice(&ty.to_le_bytes());
    n.extend_from_slice(owner);
    n.push(0);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n.extend_from_slice(desc);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

fn code_object(doc: &Value) -> Vec<u8> {
    let mut desc = Vec::new();
    rmpv::encode::write_value(&mut desc, doc).unwrap();
    // A foreign note first, to check that the search skips it.
    let mut notes = note(b"GNU", 3, b"abcd");
    notes.extend(note(b"AMDGPU", 32, &desc));
    elf_with_note(&notes)
}

fn base_kernel(name: &str) -> Vec<(&'static str, Value)> {
    vec![
        (".name", Value::from(name)),
        (".symbol", Value::from(format!("{name}.kd"))),
        (".kernarg_segment_size", Value::from(24)),
        (".sgpr_count", Value::from(20)),
        (".vgpr_count", Value::from(40)),
        (".wavefront_size", Value::from(64)),
    ]
}

fn doc(target: &str, kernels: Vec<Value>) -> Value {
    map(vec![
        ("amdhsa.version", Value::Array(vec![Value::from(1), Value::from(1)])),
        ("amdhsa.target", Value::from(target)),
        ("amdhsa.kernels", Value::Array(kernels)),
    ])
}

fn arg_map(offset: u32, size: u32, kind: &str) -> Value {
    map(vec![
        (".offset", Value::from(offset)),
        (".size", Value::from(size)),
        (".value_kind", Value::from(kind)),
    ])
}

#[test]
fn minimal_kernel_defaults_and_target_features() {
    let bytes = code_object(&doc(
        "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
        vec![map(base_kernel("k"))],
    ));
    let m: CodeObjectMetadata = parse_code_object(&bytes).unwrap();
    assert_eq!(m.arch, "gfx942");
    assert_eq!(m.target, "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-");
    assert_eq!(m.version, (1, 1));
    let k = &m.kernels[0];
    assert!(k.args.is_empty());
    assert_eq!(
        (k.kernarg_segment_size, k.sgpr_count, k.vgpr_count, k.wavefront_size),
        (24, 20, 40, 64)
    );
    // Everything optional defaults to zero / false.
    assert_eq!(
        (
            k.kernarg_segment_align,
            k.group_segment_fixed_size,
            k.private_segment_fixed_size,
            k.agpr_count,
            k.max_flat_workgroup_size,
            k.spills()
        ),
        (0, 0, 0, 0, 0, 0)
    );
    assert!(!k.uses_dynamic_stack && !k.dynamic_lds);
}

#[test]
fn hidden_and_dynamic_shared_arguments() {
    let mut k = base_kernel("h");
    k.push((
        ".args",
        Value::Array(vec![
            arg_map(0, 8, "global_buffer"),
            arg_map(8, 4, "dynamic_shared_pointer"),
            arg_map(16, 4, "hidden_block_count_x"),
            arg_map(24, 8, "hidden_dynamic_lds_size"),
            arg_map(32, 8, "image"),
        ]),
    ));
    k.push((".agpr_count", Value::from(12)));
    k.push((".vgpr_spill_count", Value::from(3)));
    k.push((".sgpr_spill_count", Value::from(2)));
    k.push((".uses_dynamic_stack", Value::from(true)));
    let m = parse_code_object(&code_object(&doc("amdgcn-amd-amdhsa--gfx90a", vec![map(k)]))).unwrap();
    let k = &m.kernels[0];
    assert_eq!(k.args.len(), 5);
    assert_eq!(
        k.args[2].value_kind,
        ArgValueKind::Hidden("hidden_block_count_x".into())
    );
    assert_eq!(k.args[4].value_kind, ArgValueKind::Other("image".into()));
    let explicit: Vec<_> = k.explicit_args().map(|a| (a.offset, a.value_kind.clone())).collect();
    assert_eq!(
        explicit,
        [
            (0, ArgValueKind::GlobalBuffer),
            (8, ArgValueKind::DynamicSharedPointer),
            (32, ArgValueKind::Other("image".into()))
        ]
    );
    assert!(k.dynamic_lds);
    assert!(k.uses_dynamic_stack);
    assert_eq!(k.agpr_count, 12);
    assert_eq!(k.spills(), 5);
    assert_eq!(
        ArgValueKind::Hidden("hidden_block_count_x".into()).to_string(),
        "hidden_block_count_x"
    );
}

#[test]
fn missing_required_fields() {
    for field in [
        ".name",
        ".symbol",
        ".kernarg_segment_size",
        ".sgpr_count",
        ".vgpr_count",
        ".wavefront_size",
    ] {
        let k: Vec<_> = base_kernel("k").into_iter().filter(|(key, _)| *key != field).collect();
        let err = parse_code_object(&code_object(&doc("amdgcn-amd-amdhsa--gfx90a", vec![map(k)]))).unwrap_err();
        let kernel = if field == ".name" { "kernel #0" } else { "kernel `k`" };
        assert_eq!(
            err,
            MetadataError::MissingField {
                kernel: kernel.into(),
                field
            },
            "{field}"
        );
    }
    // An argument without `.size`.
    let mut k = base_kernel("k");
    k.push((
        ".args",
        Value::Array(vec![map(vec![
            (".offset", Value::from(0)),
            (".value_kind", Value::from("by_value")),
        ])]),
    ));
    let err = parse_code_object(&code_object(&doc("amdgcn-amd-amdhsa--gfx90a", vec![map(k)]))).unwrap_err();
    assert_eq!(
        err,
        MetadataError::MissingField {
            kernel: "kernel `k`".into(),
            field: ".args[].size"
        }
    );
    // Top-level keys.
    let no_kernels = map(vec![
        ("amdhsa.version", Value::Array(vec![Value::from(1), Value::from(2)])),
        ("amdhsa.target", Value::from("amdgcn-amd-amdhsa--gfx90a")),
    ]);
    assert_eq!(
        parse_code_object(&code_object(&no_kernels)).unwrap_err(),
        MetadataError::MissingField {
            kernel: "the code object".into(),
            field: "amdhsa.kernels"
        }
    );
}

#[test]
fn wrong_types_are_bad_messagepack() {
    let mut k = base_kernel("k");
    k[3] = (".sgpr_count", Value::from("many"));
    let err = parse_code_object(&code_object(&doc("amdgcn-amd-amdhsa--gfx90a", vec![map(k)]))).unwrap_err();
    match err {
        MetadataError::BadMessagePack(msg) => {
            assert!(msg.contains(".sgpr_count") && msg.contains("kernel `k`"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
    let err = parse_code_object(&code_object(&Value::from(7))).unwrap_err();
    assert!(matches!(err, MetadataError::BadMessagePack(_)), "{err:?}");
}

// --------------------------------------------------------------------------------------
// Occupancy
// --------------------------------------------------------------------------------------

fn kernel(vgpr: u32, sgpr: u32, lds: u32, wave: u32) -> KernelMetadata {
    KernelMetadata {
        name: "k".into(),
        symbol: "k.kd".into(),
        args: Vec::new(),
        kernarg_segment_size: 0,
        kernarg_segment_align: 8,
        group_segment_fixed_size: lds,
        private_segment_fixed_size: 0,
        sgpr_count: sgpr,
        vgpr_count: vgpr,
        agpr_count: 0,
        sgpr_spill_count: 0,
        vgpr_spill_count: 0,
        wavefront_size: wave,
        max_flat_workgroup_size: 1024,
        uses_dynamic_stack: false,
        dynamic_lds: false,
    }
}

fn occ(waves_per_simd: u32, limited_by: &'static str) -> Option<Occupancy> {
    Some(Occupancy {
        waves_per_simd,
        limited_by,
    })
}

#[test]
fn occupancy_cdna() {
    // The reference case: tiny kernel on gfx90a is limited by the 8 wave slots.
    assert_eq!(occupancy("gfx90a", &kernel(8, 14, 0, 64), 256, 0), occ(8, "hardware"));
    assert_eq!(occupancy("gfx942", &kernel(8, 14, 0, 64), 64, 0), occ(8, "hardware"));
    // 512 / 128 = 4 waves.
    assert_eq!(occupancy("gfx90a", &kernel(128, 14, 0, 64), 256, 0), occ(4, "vgpr"));
    // 65 VGPRs round to 72: 512 / 72 = 7.
    assert_eq!(occupancy("gfx90a", &kernel(65, 14, 0, 64), 64, 0), occ(7, "vgpr"));
    // 512 unified registers: 1 wave.
    assert_eq!(occupancy("gfx90a", &kernel(512, 14, 0, 64), 64, 0), occ(1, "vgpr"));
    // AGPRs: .vgpr_count is already the unified total; a larger .agpr_count is honoured.
    let mut k = kernel(64, 14, 0, 64);
    k.agpr_count = 256;
    assert_eq!(occupancy("gfx90a", &k, 64, 0), occ(2, "vgpr"));
    // gfx9 SGPR table: > 100 SGPRs -> 7 waves.
    assert_eq!(occupancy("gfx90a", &kernel(8, 104, 0, 64), 256, 0), occ(7, "sgpr"));
    assert_eq!(occupancy("gfx90a", &kernel(8, 100, 0, 64), 256, 0), occ(8, "hardware"));
    // LDS: 40 KiB per group -> 1 group of 4 waves per CU -> 1 wave per SIMD.
    assert_eq!(
        occupancy("gfx90a", &kernel(8, 14, 40 * 1024, 64), 256, 0),
        occ(1, "lds")
    );
    // 16 KiB static + 16 KiB dynamic -> 2 groups of 4 waves -> 2 waves per SIMD.
    assert_eq!(
        occupancy("gfx90a", &kernel(8, 14, 16 * 1024, 64), 256, 16 * 1024),
        occ(2, "lds")
    );
    // More than 64 KiB cannot launch.
    assert_eq!(occupancy("gfx90a", &kernel(8, 14, 0, 64), 256, 70_000), occ(0, "lds"));
    // Whole workgroups: 1024 work-items = 16 waves; 5 waves/SIMD of VGPRs fit only one group.
    assert_eq!(occupancy("gfx90a", &kernel(96, 14, 0, 64), 1024, 0), occ(4, "vgpr"));
    // gfx950: 160 KiB of LDS per CU and per group. 40 KiB -> 4 groups of 4 waves -> 4
    // waves per SIMD (1 on gfx90a above); 70,000 bytes launch (2 groups); over 160 KiB not.
    assert_eq!(occupancy("gfx950", &kernel(8, 14, 40 * 1024, 64), 256, 0), occ(4, "lds"));
    assert_eq!(occupancy("gfx950", &kernel(8, 14, 0, 64), 256, 70_000), occ(2, "lds"));
    assert_eq!(occupancy("gfx950", &kernel(8, 14, 0, 64), 256, 160 * 1024 + 1), occ(0, "lds"));
    assert_eq!(occupancy("gfx950", &kernel(128, 14, 0, 64), 256, 0), occ(4, "vgpr"));
    // Larger than the kernel's .max_flat_workgroup_size: not launchable.
    let mut small = kernel(8, 14, 0, 64);
    small.max_flat_workgroup_size = 256;
    assert_eq!(occupancy("gfx90a", &small, 512, 0), occ(0, "hardware"));
}

#[test]
fn occupancy_rdna() {
    // gfx1100: 1536 VGPRs, granule 24, 16 waves.
    assert_eq!(occupancy("gfx1100", &kernel(4, 18, 0, 32), 256, 0), occ(16, "hardware"));
    // 128 -> 144 registers: 1536 / 144 = 10 waves.
    assert_eq!(occupancy("gfx1100", &kernel(128, 18, 0, 32), 256, 0), occ(10, "vgpr"));
    // gfx1030: 1024 VGPRs, granule 16: 128 -> 8 waves.
    assert_eq!(occupancy("gfx1030", &kernel(128, 18, 0, 32), 256, 0), occ(8, "vgpr"));
    // gfx1151 (RDNA3.5) and gfx1200/gfx1201 (RDNA4) have gfx1100's 1536 registers: 100 ->
    // 120 -> 12 waves, what LLVM 22's llc reports for a 100-VGPR kernel on each.
    for arch in ["gfx1100", "gfx1151", "gfx1200", "gfx1201"] {
        assert_eq!(occupancy(arch, &kernel(100, 18, 0, 32), 256, 0), occ(12, "vgpr"), "{arch}");
        assert_eq!(occupancy(arch, &kernel(128, 18, 0, 32), 256, 0), occ(10, "vgpr"), "{arch}");
    }
    // gfx1102 has the smaller register file.
    assert_eq!(occupancy("gfx1102", &kernel(128, 18, 0, 32), 256, 0), occ(8, "vgpr"));
    // SGPRs never limit on RDNA.
    assert_eq!(
        occupancy("gfx1100", &kernel(4, 106, 0, 32), 256, 0),
        occ(16, "hardware")
    );
    // LDS: 128 KiB per WGP, 32 KiB per group -> 4 groups of 8 waves over 4 SIMDs.
    assert_eq!(
        occupancy("gfx1100", &kernel(4, 18, 32 * 1024, 32), 256, 0),
        occ(8, "lds")
    );
    // wave64 on RDNA: 768 registers per lane, granule 12: 128 -> 132 -> 5 waves.
    assert_eq!(occupancy("gfx1100", &kernel(128, 18, 0, 64), 256, 0), occ(5, "vgpr"));
}

#[test]
fn occupancy_of_fixtures_and_unknown_archs() {
    let m = parse_code_object(GFX90A).unwrap();
    for k in &m.kernels {
        assert_eq!(occupancy(&m.arch, k, 256, 0), occ(8, "hardware"), "{}", k.name);
        // The target id works as well.
        assert_eq!(occupancy(&m.target, k, 256, 0), occ(8, "hardware"));
    }
    let m = parse_code_object(GFX1100).unwrap();
    for k in &m.kernels {
        assert_eq!(occupancy(&m.arch, k, 256, 1024), occ(16, "hardware"), "{}", k.name);
    }
    assert_eq!(
        occupancy("gfx90a:xnack-", &kernel(8, 14, 0, 64), 256, 0),
        occ(8, "hardware")
    );
    assert_eq!(occupancy("gfx803", &kernel(8, 14, 0, 64), 256, 0), None);
    assert_eq!(occupancy("sm_80", &kernel(8, 14, 0, 64), 256, 0), None);
    assert_eq!(occupancy("", &kernel(8, 14, 0, 64), 256, 0), None);
}

// --------------------------------------------------------------------------------------
// PTX
// --------------------------------------------------------------------------------------

fn p(name: &str, ty: &str, size: u32, is_ptr: bool, align: Option<u32>) -> PtxParam {
    PtxParam {
        name: name.into(),
        ty: ty.into(),
        size,
        is_ptr,
        align,
    }
}

#[test]
fn ptx_fixture() {
    let m = parse_ptx(PTX).unwrap();
    assert_eq!(m.version, "7.0");
    assert_eq!(m.target, "sm_80");
    assert_eq!(m.address_size, 64);
    let names: Vec<_> = m.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["reverse_block", "scale_add"]);

    let rb = m.entry("reverse_block").unwrap();
    assert_eq!(
        rb.params,
        [
            p("reverse_block_param_0", "u64", 8, true, Some(1)),
            p("reverse_block_param_1", "u32", 4, false, None)
        ]
    );
    assert!(rb.uses_dynamic_shared);
    assert_eq!(rb.static_shared_bytes, 0);

    // Slices are passed as one 16-byte aggregate each in PTX.
    let sa = m.entry("scale_add").unwrap();
    assert_eq!(
        sa.params,
        [
            p("scale_add_param_0", "b8", 16, false, Some(8)),
            p("scale_add_param_1", "b8", 16, false, Some(8)),
            p("scale_add_param_2", "f32", 4, false, None),
            p("scale_add_param_3", "u32", 4, false, None),
        ]
    );
    assert!(!sa.uses_dynamic_shared);
    assert_eq!(sa.static_shared_bytes, 0);
}

const HAND_PTX: &str = r#"
//
// Hand-written module exercising the parser.
//
.version 8.0
.target sm_90a, debug
.address_size 64

.file 1 "/src/k.rs"
.extern .shared .align 16 .b8 dyn_smem[];
.shared .align 4 .b8 module_tile[256];
.shared .align 4 .f32 unused_tile[64];
.global .align 1 .b8 msg[3] = {104, 105, 0};
.extern .func (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;

/* a device function touching dynamic shared memory */
.func helper(.param .b64 helper_param_0)
{
	.reg .b64 %rd<2>;
	mov.u64 %rd1, dyn_smem;
	ret;
}

.visible .func (.param .b32 r) not_an_entry(.param .b32 x)
{
	ret;
}

.visible .entry agg(
	.param .align 8 .b8 p[16],
	.param .u32 .ptr.global.align 16 q,
	.param .f64 d,
	.param .b16 h,
	.param .align 4 .b8 mat[2][3]
)
.maxntid 128, 1, 1
{
	.shared .align 8 .b8 local_tile[512];
	.shared .u32 counter;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [p+8];
	mov.u64 %rd2, module_tile;
	{ // callseq 0
	.param .b64 param0;
	st.param.b64 [param0], %rd1;
	call.uni helper, (param0);
	}
	ret;
}

.entry plain()
{
	ret;
}
"#;

#[test]
fn ptx_hand_written() {
    let m = parse_ptx(HAND_PTX).unwrap();
    assert_eq!(
        (m.version.as_str(), m.target.as_str(), m.address_size),
        ("8.0", "sm_90a", 64)
    );
    let names: Vec<_> = m.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["agg", "plain"], ".func definitions are not entries");

    let agg = m.entry("agg").unwrap();
    assert_eq!(
        agg.params,
        [
            p("p", "b8", 16, false, Some(8)),
            p("q", "u32", 4, true, Some(16)),
            p("d", "f64", 8, false, None),
            p("h", "b16", 2, false, None),
            p("mat", "b8", 6, false, Some(4)),
        ]
    );
    // dyn_smem is reached through `helper`.
    assert!(agg.uses_dynamic_shared);
    // 512 + 4 declared in the body, plus module_tile (256); unused_tile is not referenced.
    assert_eq!(agg.static_shared_bytes, 512 + 4 + 256);

    let plain = m.entry("plain").unwrap();
    assert!(plain.params.is_empty());
    assert!(!plain.uses_dynamic_shared);
    assert_eq!(plain.static_shared_bytes, 0);
}

#[test]
fn ptx_defaults_and_minimal_module() {
    let m = parse_ptx(".version 6.4\n.target sm_70\n").unwrap();
    assert_eq!(m.address_size, 32, "PTX default address size");
    assert!(m.entries.is_empty());
}

#[test]
fn ptx_garbage_is_an_error() {
    // Documented behaviour: text without `.version` is rejected, not read as an empty module.
    assert_eq!(
        parse_ptx("hello world, this is not PTX"),
        Err(PtxError::MissingDirective(".version"))
    );
    assert_eq!(parse_ptx(""), Err(PtxError::MissingDirective(".version")));
    assert_eq!(parse_ptx(".version 7.0\n"), Err(PtxError::MissingDirective(".target")));
    assert!(matches!(
        parse_ptx("\u{7f}ELF\u{2}\u{1}\u{1}\0\0\0"),
        Err(PtxError::MissingDirective(_))
    ));
    assert!(matches!(
        parse_ptx(".version 7.0\n.target sm_80\n}"),
        Err(PtxError::Unbalanced { found: '}', .. })
    ));
    assert!(matches!(
        parse_ptx(".version 7.0\n.target sm_80\n.visible .entry k(.param .u32 a) {\n ret;\n"),
        Err(PtxError::UnexpectedEof(_))
    ));
    assert!(matches!(
        parse_ptx(".version 7.0 /* open"),
        Err(PtxError::UnexpectedEof(_))
    ));
    assert!(matches!(
        parse_ptx(".version 7.0\n.target sm_80\n.address_size 48\n"),
        Err(PtxError::BadDirective {
            directive: ".address_size",
            line: 3,
            ..
        })
    ));
    let err = parse_ptx(".version 7.0\n.target sm_80\n.visible .entry k(\n.param .u33 a\n) { ret; }").unwrap_err();
    match &err {
        PtxError::BadParam { entry, line, .. } => assert_eq!((entry.as_str(), *line), ("k", 4)),
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("`k`") && msg.contains(".u33"), "{msg}");
    assert_eq!(
        PtxError::MissingDirective(".version").to_string(),
        "not a PTX module: no `.version` directive found"
    );
}
