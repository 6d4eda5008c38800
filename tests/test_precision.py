"""Tests of `tf_loss_scale.precision`: the bfloat16 advice."""

import warnings

import pytest

from tf_loss_scale import precision


def test_float16_and_float32_policies_need_no_warning():
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert not precision.warn_if_scaling_is_not_needed('float16', 'TestA')
    assert not precision.warn_if_scaling_is_not_needed('float32', 'TestA')


def test_bfloat16_warns_once_per_wrapper_and_names_it():
  with pytest.warns(UserWarning, match=r'TestB .*bfloat16.*no loss scaling'):
    assert precision.warn_if_scaling_is_not_needed('bfloat16', 'TestB')
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    # Still reported as bfloat16, but not warned about a second time.
    assert precision.warn_if_scaling_is_not_needed('bfloat16', 'TestB')
  with pytest.warns(UserWarning, match='TestC'):
    precision.warn_if_scaling_is_not_needed('bfloat16', 'TestC')
