#!/usr/bin/env python3
"""Generates the shim's view of the CUDA driver ABI from the toolkit.

Inputs: the toolkit's stub libcuda.so (which functions the driver exports) and
cudaTypedefs.h (which versions of each function cuGetProcAddress can hand out).
Outputs, all derived, none edited by hand:
  --asm      x86-64 trampolines: one weak export per driver function, each a single
             indirect jump through the table of real-driver pointers, plus the lazy
             stubs that fill that table on the first call. The functions that submit
             work touching device memory (launches, copies, memsets, graph launches,
             stream memory operations: GATED) pass the submission gate
             (interpose/gate.h) once it is on;
  --header   an X-macro list of the functions with their table index;
  --map      the linker version script exporting exactly those functions, and
             gmem's own C API: every function declared GMEM_API in the
             --public-header files (include/gmem/dedup.h);
  --proc     the cuGetProcAddress table: (name, version, per-thread, symbol);
  --references  what each gated copy, set or stream memory operation may touch,
             read from its prototype (interpose/gate_references.cpp): the
             argument positions of its CUdeviceptr and byte extent, the reader of
             its descriptor, or that it cannot be told.
"""
import argparse
import os
import re
import subprocess
import sys


def exported_functions(stub):
    out = subprocess.run(["nm", "-D", "--defined-only", stub], check=True,
                         capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "Tt" and parts[2].startswith("cu"):
            names.append(parts[2])
    return sorted(set(names))


TYPEDEF = re.compile(r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)\s*\(")
PARAMETERS = re.compile(r"PFN_(cu\w+?)_v\d+(?:_ptds|_ptsz)?\)\s*\(([^;]*)\)\s*;")

# The functions that submit work which may read or write device memory: the
# gate holds them while the pool moves memory under a live allocation.
GATED = re.compile(r"^cu(Launch|Memcpy|Memset|GraphLaunch|StreamWriteValue|StreamWaitValue|StreamBatchMemOp|"
                   r"SignalExternalSemaphoresAsync|WaitExternalSemaphoresAsync|MemPrefetch|MemDiscard)")
# Stack-passed arguments a gated call copies for the function it calls: six
# travel in registers, so functions of up to 14 integer arguments are served.
GATE_STACK_SLOTS = 8
VERSION_SUFFIX = re.compile(r"(_v\d+)?(_ptds|_ptsz)?$")


def gated_functions(typedefs, exports):
    """The exports GATED names, checked against the most arguments any ABI of
    theirs takes (cudaTypedefs.h): more than the gate passes on is an error."""
    arity = {}
    for base, params in PARAMETERS.findall(open(typedefs).read()):
        count = 0 if params.strip() in ("", "void") else params.count(",") + 1
        arity[base] = max(arity.get(base, 0), count)
    gated = [n for n in exports if GATED.match(n)]
    for name in gated:
        base = VERSION_SUFFIX.sub("", name)
        if base not in arity:
            sys.exit(f"gen_driver_api: gated {name} has no typedef in cudaTypedefs.h to check its arguments")
        if arity[base] > 6 + GATE_STACK_SLOTS:
            sys.exit(f"gen_driver_api: gated {name} takes {arity[base]} arguments, "
                     f"more than the gate passes on ({6 + GATE_STACK_SLOTS})")
    return set(gated)


# Gated calls with hooks of their own, which look at their references there
# (interpose/hooks_launch.cpp): no reference check in the trampoline.
LAUNCHES = re.compile(r"^cu(Launch|GraphLaunch)")
# Descriptors a C++ reader understands (interpose/gate_references.cpp), by the
# type of the argument that points at them.
DESCRIPTOR_READERS = {
    "CUDA_MEMCPY2D_v2": "memcpy2d",
    "CUDA_MEMCPY3D_v2": "memcpy3d",
    "CUDA_MEMCPY3D_PEER_v1": "memcpy3d_peer",
    "CUstreamBatchMemOpParams": "stream_mem_ops",
    "CUstreamBatchMemOpParams_v1": "stream_mem_ops",
}
DEVICE_POINTER = re.compile(r"^CUdeviceptr(_v[12])?$")
# Arguments the ABI passes as 32 bits: their register's upper half is not theirs.
NARROW_TYPES = {"unsigned int", "int", "cuuint32_t", "CUdeviceptr_v1"}
# The element size of a memset's value, by its type.
ELEMENT_SIZE = {"unsigned char": 1, "unsigned short": 2, "unsigned int": 4, "cuuint32_t": 4, "cuuint64_t": 8}


def parameters(text):
    """[(type, name)] of a prototype's parameter list."""
    if text.strip() in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        m = re.match(r"^(.*?)\s*\b(\w+)\s*$", p.strip())
        out.append((re.sub(r"\s+", " ", m.group(1).replace("*", " * ")).strip(), m.group(2)))
    return out


def structs_with_device_pointers(cuda_h):
    """(those that hold a CUdeviceptr at any depth, all) of cuda.h's struct and union types."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", open(cuda_h).read(), flags=re.S)
    bodies = {}
    for m in re.finditer(r"typedef\s+(?:struct|union)\s*\w*\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        names = re.match(r"\s*([\w\s,*]+);", text[i:])
        for name in re.findall(r"\w+", names.group(1) if names else ""):
            bodies[name] = text[m.end():i]
    for old, new in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text):
        if old in bodies:
            bodies.setdefault(new, bodies[old])
    holding, changed = {n for n, b in bodies.items() if "CUdeviceptr" in b}, True
    while changed:
        grown = {n for n, b in bodies.items() if set(re.findall(r"\w+", b)) & holding}
        changed = not grown <= holding
        holding |= grown
    return holding, set(bodies)


def reference_rule(params, holding, known_structs):
    """What a gated call may touch, from its parameters: (reader, a0, a1, a2, a3,
    scale, narrow mask). `arguments`: CUdeviceptr at a0 and a1, extent
    arg[a2] * arg[a3] * scale (an absent position counts 1); `upload`: a copy
    from host memory at a1 of arg[a2] bytes to the CUdeviceptr at a0 (the
    gate shows the host bytes to its upload check); `unified`: a copy of
    arg[a2] bytes from a1 to a0, either of which may be host memory (read as
    `arguments`; where the source is host memory, the gate shows its bytes to
    the upload check too); `arrays`: device
    pointer arrays at a0 and a1, sizes at a2, their count at a3; a descriptor
    reader: the descriptor at a0 (and for stream_mem_ops, its count at a1);
    `unknown`: may touch device memory that cannot be told; `none`: touches
    no device memory the pool can hold (arrays, host memory, semaphores)."""
    types = [t for t, _ in params]
    names = [n for _, n in params]
    narrow = sum(1 << k for k, t in enumerate(types) if t.replace("const ", "") in NARROW_TYPES)
    base = [t.replace("const ", "").replace("*", "").strip() for t in types]
    for k, (t, b) in enumerate(zip(types, base)):
        if "*" in t and b in DESCRIPTOR_READERS:
            reader = DESCRIPTOR_READERS[b]
            count = names.index("count") if reader == "stream_mem_ops" else -1
            return (reader, k, count, -1, -1, 1, narrow)
    pointer_arrays = [k for k, (t, b) in enumerate(zip(types, base)) if "*" in t and DEVICE_POINTER.match(b)]
    if pointer_arrays:
        if "sizes" in names and "count" in names and len(pointer_arrays) <= 2:
            a = pointer_arrays + [-1] * (2 - len(pointer_arrays))
            return ("arrays", a[0], a[1], names.index("sizes"), names.index("count"), 1, narrow)
        return ("unknown", -1, -1, -1, -1, 1, narrow)
    # A descriptor that holds a device pointer (or one cuda.h does not lay out).
    if any("*" in t and (b in holding or (b.startswith("CUDA_") and b not in known_structs))
           for t, b in zip(types, base)):
        return ("unknown", -1, -1, -1, -1, 1, narrow)
    pointers = [k for k, (t, b) in enumerate(zip(types, base)) if "*" not in t and DEVICE_POINTER.match(b)]
    if not pointers:
        return ("none", -1, -1, -1, -1, 1, narrow)
    if len(pointers) > 2:
        sys.exit(f"gen_driver_api: a gated call with {len(pointers)} device pointers: {params}")
    if "srcHost" in names and "ByteCount" in names and len(pointers) == 1:  # a copy from host memory to the device
        return ("upload", pointers[0], names.index("srcHost"), names.index("ByteCount"), -1, 1, narrow)
    a0, a1 = (pointers + [-1])[:2]
    if names[:3] == ["dst", "src", "ByteCount"]:  # cuMemcpy(Async): each side told by its address
        return ("unified", a0, a1, 2, -1, 1, narrow)
    extent, scale = [-1, -1], 1
    if "ByteCount" in names:
        extent[0] = names.index("ByteCount")
    elif "dstPitch" in names and "Height" in names:  # a 2D memset: whole rows
        extent = [names.index("dstPitch"), names.index("Height")]
    elif "N" in names:  # a memset of N elements of its value's size
        extent[0] = names.index("N")
        scale = ELEMENT_SIZE[types[names.index("N") - 1]]
    elif "count" in names:
        extent[0] = names.index("count")
    elif "value" in names:  # a stream memory operation on one word
        scale = ELEMENT_SIZE[types[names.index("value")]]
    return ("arguments", a0, a1, extent[0], extent[1], scale, narrow)


def reference_rules(typedefs, exports, gated):
    """{symbol: rule} for the gated exports other than launches."""
    text = open(typedefs).read()
    prototypes = {f"{base}_v{ver}{suffix}": params
                  for base, ver, suffix, params in
                  re.findall(r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)\s*\(([^;]*)\)\s*;", text)}
    holding, known = structs_with_device_pointers(os.path.join(os.path.dirname(typedefs), "cuda.h"))
    rows, _ = proc_table(typedefs, exports)
    rules = {}
    for base, ver, per_thread, symbol in rows:
        if symbol not in gated or LAUNCHES.match(symbol):
            continue
        suffix = symbol[-5:] if per_thread else ""
        rules[symbol] = reference_rule(parameters(prototypes[f"{base}_v{ver}{suffix}"]), holding, known)
    missing = sorted(n for n in gated if not LAUNCHES.match(n) and n not in rules)
    if missing:
        sys.exit(f"gen_driver_api: gated calls without a prototype to read their references from: {missing}")
    return rules


def proc_table(typedefs, exports):
    """Maps each (base name, version[, per-thread]) to the exported symbol.

    cudaTypedefs.h names each ABI of a function PFN_<base>_v<cuda version>. The
    first ABI is the bare name, the k-th is <base>_v<k>; a per-thread variant
    (_ptds/_ptsz) belongs to the newest plain ABI not newer than it.
    """
    plain, per_thread = {}, {}
    for base, ver, suffix in TYPEDEF.findall(open(typedefs).read()):
        (per_thread if suffix else plain).setdefault(base, set()).add((int(ver), suffix))
    rows, missing = [], []
    for base in sorted(plain):
        versions = sorted(v for v, _ in plain[base])
        symbol_of = {}
        for k, ver in enumerate(versions):
            symbol_of[ver] = base if k == 0 else f"{base}_v{k + 1}"
            rows.append((base, ver, 0, symbol_of[ver]))
        for ver, suffix in sorted(per_thread.get(base, ())):
            older = [v for v in versions if v <= ver] or versions[:1]
            rows.append((base, ver, 1, symbol_of[older[-1]] + suffix))
    known = set(exports)
    kept = []
    for row in rows:
        (kept if row[3] in known else missing).append(row)
    return kept, missing


def write_asm(path, names, gated=frozenset()):
    with open(path, "w") as f:
        f.write("/* Generated by scripts/gen_driver_api.py. Do not edit. */\n")
        f.write("    .text\n")
        for i, name in enumerate(names):
            # Weak, so that a hook defined in C++ with the same name replaces it.
            f.write(f"    .globl {name}\n    .weak {name}\n    .type {name},@function\n"
                    f"    .p2align 4\n{name}:\ngmem_trampoline_{i}:\n")
            if name in gated:
                f.write(f"    cmpb $0, gmem_gate_on(%rip)\n    jne gmem_gated_{i}\n")
            f.write(f"    jmp *gmem_real_table+{8 * i}(%rip)\n    .size {name},.-{name}\n")
        for i in range(len(names)):
            f.write(f"gmem_lazy_{i}:\n    movl ${i}, %r11d\n    jmp gmem_lazy_common\n")
        for i, name in enumerate(names):
            if name in gated:
                f.write(f"gmem_gated_{i}:\n    movl ${i}, %r11d\n    jmp gmem_gate_common\n")
        copy_slots = "".join(f"    movq {16 + 8 * k}(%rbp), %r10\n    movq %r10, {8 * k}(%rsp)\n"
                             for k in range(GATE_STACK_SLOTS))
        f.write("""
    /* Every argument register, around a call into C (%r11: the function's index). */
    .macro gmem_save_arguments
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    pushq %r11
    subq $136, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    .endm
    .macro gmem_restore_arguments
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    addq $136, %rsp
    popq %r11
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    .endm

    /* First call of any driver function: save the argument registers, resolve
       the real driver once, then continue into the function that was called. */
    .p2align 4
gmem_lazy_common:
    gmem_save_arguments
    call gmem_resolve_driver
    gmem_restore_arguments
    leaq gmem_real_table(%rip), %r10
    jmp *(%r10,%r11,8)

    /* A gated function (%r11: its index): while references are checked
       (gmem_gate_check_on), gmem_gate_check_references sees what it may
       touch and, where it lets the call go, counts it itself (it returns 1:
       on to gmem_gate_counted); else the call is counted as it enters
       (gmem_gate_entries) and in flight while it runs; while the gate is
       closed, it waits in gmem_gate_wait before it starts, and is checked
       again. It is called rather than jumped to, so its stack arguments are
       copied below the return address it gets. */
    .p2align 4
    .type gmem_gate_common,@function
gmem_gate_common:
    .cfi_startproc
    pushq %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    movq %rsp, %rbp
    .cfi_def_cfa_register %rbp
    pushq %r11
gmem_gate_check:
    cmpb $0, gmem_gate_check_on(%rip)
    jne gmem_gate_check_now
gmem_gate_enter:
#ifdef __SANITIZE_THREAD__
    gmem_save_arguments
    call gmem_gate_tsan_enter
    movzbl %al, %r10d
    gmem_restore_arguments
    testl %r10d, %r10d
    jne gmem_gate_wait_now
#else
    lock incq gmem_gate_entries(%rip)
    lock incq gmem_gate_in_flight(%rip)
    cmpb $0, gmem_gate_closed(%rip)
    jne gmem_gate_closed_now
#endif
gmem_gate_counted:
    subq $""" + str(8 * GATE_STACK_SLOTS + 8) + """, %rsp
""" + copy_slots + """    movq -8(%rbp), %r11
    leaq gmem_real_table(%rip), %r10
    call *(%r10,%r11,8)
#ifdef __SANITIZE_THREAD__
    pushq %rax
    pushq %rax
    call gmem_gate_tsan_leave
    popq %rax
    popq %rax
#else
    lock decq gmem_gate_in_flight(%rip)
#endif
    leave
    .cfi_def_cfa %rsp, 8
    ret
    .cfi_def_cfa %rbp, 16
gmem_gate_closed_now:
    lock decq gmem_gate_in_flight(%rip)
gmem_gate_wait_now:
    gmem_save_arguments
    call gmem_gate_wait
    gmem_restore_arguments
    jmp gmem_gate_check
gmem_gate_check_now:
    gmem_save_arguments
    movq -8(%rbp), %rdi
    leaq 152(%rsp), %rsi
    leaq 16(%rbp), %rdx
    call gmem_gate_check_references
    movzbl %al, %r10d
    gmem_restore_arguments
    testl %r10d, %r10d
    jne gmem_gate_counted
    jmp gmem_gate_enter
    .cfi_endproc
    .size gmem_gate_common,.-gmem_gate_common

    .data
    .p2align 6
    .globl gmem_real_table
    .hidden gmem_real_table
gmem_real_table:
""")
        for i in range(len(names)):
            f.write(f"    .quad gmem_lazy_{i}\n")
        # Our own export of each function (the hook where there is one), for
        # cuGetProcAddress, and the trampoline where it only forwards (0 where
        # it gates), to tell the functions the shim must see apart.
        f.write("\n    .section .data.rel.ro\n    .p2align 3\n"
                "    .globl gmem_export_table\n    .hidden gmem_export_table\n"
                "gmem_export_table:\n")
        for name in names:
            f.write(f"    .quad {name}\n")
        f.write("    .globl gmem_trampoline_table\n    .hidden gmem_trampoline_table\n"
                "gmem_trampoline_table:\n")
        for i, name in enumerate(names):
            f.write("    .quad 0\n" if name in gated else f"    .quad gmem_trampoline_{i}\n")
        f.write('    .section .note.GNU-stack,"",@progbits\n')


def write_header(path, names):
    with open(path, "w") as f:
        f.write("// Generated by scripts/gen_driver_api.py. Do not edit.\n#pragma once\n\n")
        f.write(f"#define GMEM_DRIVER_FUNCTION_COUNT {len(names)}\n\n")
        f.write("// X(name, index) for every function the CUDA driver exports.\n")
        f.write("#define GMEM_DRIVER_FUNCTIONS(X) \\\n")
        f.write(" \\\n".join(f"    X({n}, {i})" for i, n in enumerate(names)))
        f.write("\n")


def write_references(path, names, rules):
    with open(path, "w") as f:
        f.write("// Generated by scripts/gen_driver_api.py. Do not edit.\n")
        f.write("// X(index, name, reader, a0, a1, a2, a3, scale, narrow) for each gated call other\n"
                "// than a launch (what the fields mean: reference_rule in the script).\n")
        f.write("#define GMEM_GATE_REFERENCES(X) \\\n")
        f.write(" \\\n".join(f"    X({i}, {n}, {r[0]}, {r[1]}, {r[2]}, {r[3]}, {r[4]}, {r[5]}, {r[6]:#x})"
                              for i, n in enumerate(names) if n in rules for r in [rules[n]]))
        f.write("\n")


PUBLIC_API = re.compile(r"\bGMEM_API\b[^;(]*?\b(gmem_\w+)\s*\(")


def public_functions(headers):
    """gmem's own exported C API: the functions its public headers declare GMEM_API."""
    names = []
    for header in headers:
        names += PUBLIC_API.findall(open(header).read())
    return sorted(set(names))


def write_map(path, names):
    with open(path, "w") as f:
        f.write("/* Generated by scripts/gen_driver_api.py. Do not edit. */\n{\n  global:\n")
        for n in names:
            f.write(f"    {n};\n")
        f.write("  local:\n    *;\n};\n")


def write_proc(path, rows):
    with open(path, "w") as f:
        f.write("// Generated by scripts/gen_driver_api.py. Do not edit.\n")
        f.write("// X(base name, first CUDA version, per-thread default stream, symbol),\n")
        f.write("// sorted by base name, then per-thread, then version.\n")
        f.write("#define GMEM_PROC_TABLE(X) \\\n")
        rows = sorted(rows, key=lambda r: (r[0], r[2], r[1]))
        f.write(" \\\n".join(f'    X("{b}", {v}, {p}, {s})' for b, v, p, s in rows))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stub", required=True, help="the toolkit's stubs/libcuda.so")
    ap.add_argument("--typedefs", required=True, help="the toolkit's cudaTypedefs.h")
    ap.add_argument("--asm")
    ap.add_argument("--header")
    ap.add_argument("--map")
    ap.add_argument("--proc")
    ap.add_argument("--references")
    ap.add_argument("--public-header", action="append", default=[],
                    help="a public header whose GMEM_API functions the map exports too")
    ap.add_argument("--list", action="store_true", help="print the exported names")
    args = ap.parse_args()

    names = exported_functions(args.stub)
    if not names:
        sys.exit(f"gen_driver_api: no cu* functions exported by {args.stub}")
    rows, missing = proc_table(args.typedefs, names)
    if args.list:
        print("\n".join(names))
        for row in missing:
            print(f"# typedef without export: {row}", file=sys.stderr)
    gated = gated_functions(args.typedefs, names) if args.asm or args.references else set()
    if args.asm:
        write_asm(args.asm, names, gated)
    if args.references:
        write_references(args.references, names, reference_rules(args.typedefs, names, gated))
    if args.header:
        write_header(args.header, names)
    if args.map:
        public = public_functions(args.public_header)
        if args.public_header and not public:
            sys.exit(f"gen_driver_api: no GMEM_API function in {args.public_header}")
        write_map(args.map, names + public)
    if args.proc:
        write_proc(args.proc, rows)


if __name__ == "__main__":
    main()
