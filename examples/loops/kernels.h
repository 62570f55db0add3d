/* Shared helpers for the freestanding loop kernels (no libc).
 *
 * Every kernel is exported under its C name via export_name, so the
 * modules do not depend on --export-dynamic or on symbol visibility.
 * Pointers are i32 byte offsets into the module's exported "memory".
 */
#ifndef TENSORWASM_EXAMPLES_KERNELS_H
#define TENSORWASM_EXAMPLES_KERNELS_H

#define EXPORT(name) __attribute__((export_name(#name))) name

/* Defined by wasm-ld: first byte after static data and the stack.  Memory
 * from here up to memory.size * 65536 is free for callers to use. */
extern unsigned char __heap_base;

/* Returns the offset of the first free byte of linear memory (16-byte
 * aligned) so a test harness can place its input/output arrays there. */
__attribute__((export_name("scratch_base"))) int scratch_base(void) {
  return ((int)&__heap_base + 15) & ~15;
}

#endif
