"""Analysis of a model's constraints: rank, the reduction index matrix and the
differential index of its DAE (Costa-Castelló, Griñó & Basañez 1998), a search for singular
configurations (their Proposition 1), and the Frobenius test that tells holonomic
from nonholonomic velocity constraints (Yun & Sarkar 1998, Remark 1)."""

from ._constraints import along as along
from ._constraints import constraint_rank as constraint_rank
from ._constraints import differential_index as differential_index
from ._constraints import IndexMatrix as IndexMatrix
from ._constraints import reduction_index_matrix as reduction_index_matrix
from ._constraints import singular_configurations as singular_configurations
from ._constraints import SingularSearch as SingularSearch
from .._consistent import inconsistency as inconsistency
from ._frobenius import frobenius as frobenius
from ._frobenius import Involutivity as Involutivity
