/* Allocation failures while planning a server-driven registration
 * (docs/testing.md): kernel groups from EngineGroupInfos, object groups,
 * and the CPU copy of a chunk.  A failed plan must say so (-2) and leave
 * nothing allocated (ASan's leak check), never a half-built plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "kv/kv_plan.h"

static lmc_shared_tensor fa_nhd(int64_t bs, int64_t nh, int64_t hs)
{
    lmc_shared_tensor t = {.wrapper = LMC_WRAPPER_CPU_SHM, .itemsize = 2, .ndim = 5,
                           .shape = {2, 8, bs, nh, hs}};
    strcpy(t.dtype, "float16");
    int64_t acc = 1;
    for (int d = 4; d >= 0; d--) {
        t.stride[d] = acc;
        acc *= t.shape[d];
    }
    return t;
}

/* Three engine groups (two block sizes, a window) in two object groups,
 * then a plain registration grouped by tensor kind. */
static int plans(void *arg)
{
    (void)arg;
    lmc_shared_tensor t[5] = {fa_nhd(16, 2, 8), fa_nhd(16, 2, 8), fa_nhd(32, 1, 16),
                              fa_nhd(16, 2, 4), fa_nhd(16, 2, 4)};
    static const uint32_t l0[] = {0, 1}, l1[] = {2}, l2[] = {3, 4};
    lmc_engine_group_info infos[3] = {
        {.layers = l0, .n_layers = 2, .tokens_per_block = 16, .sw_size_tokens = -1},
        {.engine_group_id = 1, .layers = l1, .n_layers = 1, .tokens_per_block = 32,
         .sw_size_tokens = -1},
        {.engine_group_id = 2, .layers = l2, .n_layers = 2, .tokens_per_block = 16,
         .sw_size_tokens = 32}};
    lmc_kv_plan_options o = {.engine = LMC_ENGINE_VLLM, .chunk_size = 64,
                             .separate_object_groups = true, .infos = infos, .n_infos = 3};
    lmc_kv_plan p;
    char err[256];
    int rc = lmc_kv_plan_build(t, 5, &o, &p, err, sizeof err);
    if (rc == -2)
        return p.kg == NULL && p.n_kg == 0 ? LMC_FAULT_ERROR
                                           : lmc_fault_violation("a failed plan kept groups");
    if (rc != 0)
        return lmc_fault_violation("plan refused: %s", err);
    int out = p.n_kg == 3 && p.n_og == 2 ? LMC_FAULT_OK
                                         : lmc_fault_violation("%u kernel groups", p.n_kg);
    lmc_kv_plan_free(&p);
    o.infos = NULL;
    o.n_infos = 0;
    rc = lmc_kv_plan_build(t, 5, &o, &p, err, sizeof err);
    if (rc == -2)
        return LMC_FAULT_ERROR;
    if (rc == 0 && p.n_kg != 3)
        out = lmc_fault_violation("%u kernel groups by kind", p.n_kg);
    lmc_kv_plan_free(&p);
    return rc == 0 ? out : lmc_fault_violation("plan by kind refused: %s", err);
}

static void test_plans(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("modules.kv_plan", plans, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
