"""Loop analysis: the loop forest, induction variables, affine accesses, dependences,
plans and device-resident regions."""
