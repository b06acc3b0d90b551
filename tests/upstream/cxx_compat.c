/* One libstdc++ symbol that upstream LMCache's compiled module needs and
 * Debian 12's libstdc++ (GCC 12) lacks (tests/upstream/README.md).
 *
 * lmcache 0.5.6's lmcache_native extension was built with GCC 13, whose
 * std::string::replace() calls an out-of-line helper for the case where
 * the replacement text lies inside the string itself.  compat.py loads
 * this library with RTLD_GLOBAL before importing lmcache, so the dynamic
 * linker resolves the helper here.  It is written from what the helper
 * must do, not from GCC's sources: given the string's buffer at p, replace
 * the len1 characters there with the len2 characters at s (which may
 * overlap them), moving the how_much characters that follow the replaced
 * span to their new place.  The caller has already made room and sets the
 * new length afterwards. */
#include <stdlib.h>
#include <string.h>

void _ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE15_M_replace_coldEPcmPKcmm(
    void *self, char *p, size_t len1, const char *s, size_t len2, size_t how_much);

void _ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE15_M_replace_coldEPcmPKcmm(
    void *self, char *p, size_t len1, const char *s, size_t len2, size_t how_much)
{
    (void)self;
    char small[256];
    /* s may point into the tail that is about to move: copy it first. */
    char *copy = len2 <= sizeof small ? small : malloc(len2);
    if (!copy)
        abort();
    memcpy(copy, s, len2);
    if (how_much && len1 != len2)
        memmove(p + len2, p + len1, how_much);
    memcpy(p, copy, len2);
    if (copy != small)
        free(copy);
}
