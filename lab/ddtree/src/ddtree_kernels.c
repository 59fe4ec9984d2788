/* Lab stand-in for the DDTree build's tree-verify kernels (a test double).
 *
 * The real build ships CUDA kernels compiled against the CUDA 12 runtime; its
 * shared object needs libcudart.so.12 (ELF DT_NEEDED), which is what crashed
 * ct129 (CUDA 13 user space only) on the first real decode. This stand-in does
 * the same linking: lab/ddtree/build.py links it against a soname-only
 * libcudart.so.12 with --no-as-needed, so the dynamic loader demands the CUDA 12
 * runtime when ddtree_utils opens it with ctypes.CDLL. No CUDA symbol is used:
 * any libcudart.so.12 satisfies it.
 */

/* The longest prefix of the draft the target agrees with: what a tree-verify
 * step accepts along one branch. */
int ddtree_accept_length(const int *draft, const int *target, int count)
{
    int accepted = 0;
    while (accepted < count && draft[accepted] == target[accepted])
        accepted++;
    return accepted;
}

const char ddtree_kernels_stand_in[] = "inferops.sglang lab DDTree kernels stand-in (needs libcudart.so.12)";
