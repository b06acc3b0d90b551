/* Allocation failures in the pickle reader and the tensor-wrapper decoder
 * (src/rpc/pickle.c, src/kv/shared_tensor.c): every failure is -2 with
 * a message that says memory, never a refusal that blames the client's
 * pickle, and nothing leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../unit/kv/pickle_vectors.h"
#include "alloc_fault.h"
#include "kv/shared_tensor.h"

typedef struct {
    const uint8_t *data;
    size_t len;
    lmc_tensor_wrapper wrapper;
} vector;

static int decode(void *arg)
{
    const vector *v = arg;
    lmc_shared_tensor t;
    char err[256] = "";
    int rc = lmc_shared_tensor_decode(v->data, v->len, &t, err, sizeof err);
    if (rc == -2)
        return strstr(err, "out of memory") ? LMC_FAULT_ERROR
                                            : lmc_fault_violation("-2 said '%s'", err);
    if (rc != 0)
        return lmc_fault_violation("a good wrapper refused: %s", err);
    return t.wrapper == v->wrapper && t.itemsize > 0 ? LMC_FAULT_OK
                                                     : lmc_fault_violation("wrong wrapper");
}

static void test_decode(void **state)
{
    (void)state;
    vector vs[] = {
        {good_cuda_ipc_v2, sizeof good_cuda_ipc_v2, LMC_WRAPPER_CUDA_IPC},
        {good_raw_cuda_ipc, sizeof good_raw_cuda_ipc, LMC_WRAPPER_RAW_CUDA_IPC},
        {good_cpu_shm, sizeof good_cpu_shm, LMC_WRAPPER_CPU_SHM},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
        assert_int_equal(lmc_fault_run("shared_tensor.decode", decode, &vs[i], NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_decode)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
