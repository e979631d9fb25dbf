from shoal._cli import main

main()
