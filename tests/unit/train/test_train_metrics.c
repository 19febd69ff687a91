/* The trainer's Prometheus series: after a run they hold exactly the run's own counts
 * (examples, steps, stage seconds), a finite loss near the result's, the workers, and stay in
 * the exposition once the run is over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/metrics.h"
#include "granary/train.h"
#include "support/train_fixture.h"

static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

static void test_run_series_exact(void **state)
{
    (void)state;
    tr_fixture fx;
    assert_int_equal(tr_fixture_make(&fx, "trmetrics", 3), 0);
    gr_train_opts o;
    tr_fixture_small_dlrm(&fx, &o, GR_MODE_ASYNC, 2);
    o.test_path = NULL;
    gr_metrics *reg;
    assert_int_equal(gr_metrics_create(&reg), GR_OK);
    o.metrics = reg;
    gr_train_backend be;
    assert_int_equal(gr_local_backend_create(NULL, &be), GR_OK);
    gr_train_result r;
    assert_int_equal(gr_train_run(&o, &be, &r), GR_OK);
    gr_train_backend_destroy(&be);
    char *txt;
    assert_int_equal(gr_metrics_format(reg, &txt, NULL), GR_OK);
    assert_true(value_of(txt, "granary_train_examples_total") == (double)r.examples);
    assert_true(r.examples == 40000);
    assert_true(value_of(txt, "granary_train_steps_total") == (double)r.steps);
    assert_true(value_of(txt, "granary_train_workers") == 2);
    assert_true(value_of(txt, "granary_train_workers_running") == 0);
    assert_true(value_of(txt, "granary_train_dropped_gradients_total") == 0);
    double loss = value_of(txt, "granary_train_loss");
    assert_true(isfinite(loss) && loss > 0 && loss < 1);
    assert_true(fabs(loss - r.last_loss) < 1e-12); /* no progress lines: the run's mean */
    double rate = value_of(txt, "granary_train_examples_per_second");
    assert_true(rate > 0 && rate <= r.examples / r.train_seconds * 1.5);
    assert_true(value_of(txt, "granary_train_stage_seconds_total{stage=\"compute\"}") ==
                r.compute_seconds);
    assert_true(value_of(txt, "granary_train_checkpoints_total") == 0);
    free(txt);
    gr_metrics_destroy(reg);
    tr_fixture_remove(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_series_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
