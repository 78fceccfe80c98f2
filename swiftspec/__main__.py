from swiftspec.cli import main

main()
